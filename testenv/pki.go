package main

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// pki holds the files of the control plane's throwaway certificate authority.
type pki struct {
	Dir          string
	CACert       string
	ServingCert  string
	ServingKey   string
	AdminCert    string
	AdminKey     string
	KCMCert      string
	KCMKey       string
	SchedCert    string
	SchedKey     string
	SAPublicKey  string
	SAPrivateKey string
}

func newPKI(dir string) (*pki, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	p := &pki{
		Dir:          dir,
		CACert:       filepath.Join(dir, "ca.crt"),
		ServingCert:  filepath.Join(dir, "serving.crt"),
		ServingKey:   filepath.Join(dir, "serving.key"),
		AdminCert:    filepath.Join(dir, "admin.crt"),
		AdminKey:     filepath.Join(dir, "admin.key"),
		KCMCert:      filepath.Join(dir, "kube-controller-manager.crt"),
		KCMKey:       filepath.Join(dir, "kube-controller-manager.key"),
		SchedCert:    filepath.Join(dir, "kube-scheduler.crt"),
		SchedKey:     filepath.Join(dir, "kube-scheduler.key"),
		SAPublicKey:  filepath.Join(dir, "sa.pub"),
		SAPrivateKey: filepath.Join(dir, "sa.key"),
	}

	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	now := time.Now().Add(-time.Hour)
	caTmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: "reloader-testenv-ca"},
		NotBefore:             now,
		NotAfter:              now.Add(10 * 365 * 24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, err
	}
	caCert, err := x509.ParseCertificate(caDER)
	if err != nil {
		return nil, err
	}
	if err := writePEM(p.CACert, "CERTIFICATE", caDER); err != nil {
		return nil, err
	}

	issue := func(certPath, keyPath string, tmpl *x509.Certificate) error {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return err
		}
		tmpl.SerialNumber = serial()
		tmpl.NotBefore = now
		tmpl.NotAfter = now.Add(10 * 365 * 24 * time.Hour)
		tmpl.KeyUsage = x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment
		der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &key.PublicKey, caKey)
		if err != nil {
			return err
		}
		if err := writePEM(certPath, "CERTIFICATE", der); err != nil {
			return err
		}
		return writeKey(keyPath, key)
	}

	serving := &x509.Certificate{
		Subject:     pkix.Name{CommonName: "kube-apiserver"},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames: []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc",
			"kubernetes.default.svc.cluster.local"},
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1"), net.ParseIP("10.0.0.1")},
	}
	if err := issue(p.ServingCert, p.ServingKey, serving); err != nil {
		return nil, err
	}
	admin := &x509.Certificate{
		Subject:     pkix.Name{CommonName: "testenv-admin", Organization: []string{"system:masters"}},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	if err := issue(p.AdminCert, p.AdminKey, admin); err != nil {
		return nil, err
	}
	// The controller manager runs with its own credentials (no per-controller service accounts),
	// so it needs cluster-admin rights, as kubeadm's does with use-service-account-credentials off.
	kcmIdentity := &x509.Certificate{
		Subject: pkix.Name{CommonName: "system:kube-controller-manager",
			Organization: []string{"system:masters"}},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	if err := issue(p.KCMCert, p.KCMKey, kcmIdentity); err != nil {
		return nil, err
	}
	// The scheduler has the rights the bootstrap policy gives its well-known user.
	schedIdentity := &x509.Certificate{
		Subject:     pkix.Name{CommonName: "system:kube-scheduler"},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	if err := issue(p.SchedCert, p.SchedKey, schedIdentity); err != nil {
		return nil, err
	}

	saKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return nil, err
	}
	if err := writeKey(p.SAPrivateKey, saKey); err != nil {
		return nil, err
	}
	pubDER, err := x509.MarshalPKIXPublicKey(&saKey.PublicKey)
	if err != nil {
		return nil, err
	}
	if err := writePEM(p.SAPublicKey, "PUBLIC KEY", pubDER); err != nil {
		return nil, err
	}
	return p, nil
}

func serial() *big.Int {
	n, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	return n
}

func writeKey(path string, key crypto.Signer) error {
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return err
	}
	return writePEM(path, "PRIVATE KEY", der)
}

func writePEM(path, kind string, der []byte) error {
	data := pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: der})
	if data == nil {
		return fmt.Errorf("encode %s", path)
	}
	return os.WriteFile(path, data, 0o600)
}

// kubeconfig writes a kubeconfig for server that authenticates with a client certificate,
// embedding the files so the kubeconfig stays valid wherever it is copied.
func writeKubeconfig(path, server, caPath, certPath, keyPath, user string) error {
	ca, err := os.ReadFile(caPath)
	if err != nil {
		return err
	}
	cert, err := os.ReadFile(certPath)
	if err != nil {
		return err
	}
	key, err := os.ReadFile(keyPath)
	if err != nil {
		return err
	}
	b64 := func(b []byte) string { return encodeBase64(b) }
	content := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: testenv
  cluster:
    server: %s
    certificate-authority-data: %s
users:
- name: %s
  user:
    client-certificate-data: %s
    client-key-data: %s
contexts:
- name: testenv
  context:
    cluster: testenv
    user: %s
    namespace: default
current-context: testenv
`, server, b64(ca), user, b64(cert), b64(key), user)
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(content), 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}
