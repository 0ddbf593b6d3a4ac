// Command image-build assembles the operator's OCI image without a container engine, with
// go-containerregistry: one image per platform (the release binary at /reloader and a CA
// bundle, non-root 65532:65532, entrypoint /reloader, OCI labels), an image index over them,
// written as an OCI image layout directory and as an OCI archive (that directory as a tar).
//
// The CA bundle is the NSS trust store as golang.org/x/crypto/x509roots/fallback/bundle pins it
// (go.sum holds its hash), so every machine builds the same bytes. Roots NSS distrusts after a
// date (a constraint PEM cannot carry) are left out.
//
// Everything is dated --created (the commit time), so the same inputs give the same digests.
//
//	image-build --out target/image --name reloader --created 2026-01-01T00:00:00Z \
//	  --label org.opencontainers.image.version=0.1.0 ... \
//	  --platform linux/amd64=target/x86_64-unknown-linux-musl/release/reloader \
//	  --platform linux/arm64=target/aarch64-unknown-linux-musl/release/reloader
package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"encoding/pem"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"golang.org/x/crypto/x509roots/fallback/bundle"
)

const (
	binaryPath = "reloader"
	caPath     = "etc/ssl/certs/ca-certificates.crt"
	user       = "65532:65532"
	refName    = "org.opencontainers.image.ref.name"
	created    = "org.opencontainers.image.created"
)

type multi []string

func (m *multi) String() string     { return strings.Join(*m, ",") }
func (m *multi) Set(v string) error { *m = append(*m, v); return nil }

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "image-build:", err)
		os.Exit(1)
	}
}

func run() error {
	var platforms, labels multi
	out := flag.String("out", "target/image", "output directory: <out>/oci (layout) and <out>/<name>-<version>.oci.tar")
	name := flag.String("name", "reloader", "image name, used in the archive's file name")
	createdAt := flag.String("created", "1970-01-01T00:00:00Z", "creation time (RFC 3339) of every file, config and annotation")
	flag.Var(&platforms, "platform", "os/arch[/variant]=path of the binary (repeat)")
	flag.Var(&labels, "label", "key=value: an image config label, also a manifest and index annotation (repeat)")
	flag.Parse()
	if len(platforms) == 0 {
		return errors.New("no --platform given")
	}
	when, err := time.Parse(time.RFC3339, *createdAt)
	if err != nil {
		return fmt.Errorf("--created: %w", err)
	}
	when = when.UTC()
	annotations := map[string]string{created: when.Format(time.RFC3339)}
	for _, l := range labels {
		k, v, ok := strings.Cut(l, "=")
		if !ok || k == "" {
			return fmt.Errorf("--label %q is not key=value", l)
		}
		annotations[k] = v
	}
	version := annotations["org.opencontainers.image.version"]
	if version == "" {
		return errors.New("no --label org.opencontainers.image.version=…")
	}
	ca, err := caBundle()
	if err != nil {
		return err
	}

	idx := mutate.IndexMediaType(empty.Index, types.OCIImageIndex)
	for _, p := range platforms {
		spec, binary, ok := strings.Cut(p, "=")
		if !ok {
			return fmt.Errorf("--platform %q is not os/arch=path", p)
		}
		platform, err := v1.ParsePlatform(spec)
		if err != nil {
			return fmt.Errorf("--platform %q: %w", p, err)
		}
		img, err := image(*platform, binary, ca, when, annotations)
		if err != nil {
			return fmt.Errorf("%s: %w", spec, err)
		}
		idx = mutate.AppendManifests(idx, mutate.IndexAddendum{
			Add:        img,
			Descriptor: v1.Descriptor{Platform: platform},
		})
	}
	idx = mutate.Annotations(idx, annotations).(v1.ImageIndex)

	dir := filepath.Join(*out, "oci")
	if err := os.RemoveAll(dir); err != nil {
		return err
	}
	lp, err := layout.Write(dir, empty.Index)
	if err != nil {
		return err
	}
	if err := lp.AppendIndex(idx, layout.WithAnnotations(map[string]string{refName: version})); err != nil {
		return err
	}
	archive := filepath.Join(*out, fmt.Sprintf("%s-%s.oci.tar", *name, version))
	if err := tarDir(dir, archive, when); err != nil {
		return err
	}
	digest, err := idx.Digest()
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(*out, "index-digest"), []byte(digest.String()+"\n"), 0o644); err != nil {
		return err
	}
	fmt.Printf("image-build: %s (layout %s), index %s\n", archive, dir, digest)
	return nil
}

// caBundle is the PEM of every root of the pinned NSS bundle that has no extra constraint.
func caBundle() ([]byte, error) {
	var b bytes.Buffer
	n := 0
	for root := range bundle.Roots() {
		if root.Constraint != nil {
			continue
		}
		if err := pem.Encode(&b, &pem.Block{Type: "CERTIFICATE", Bytes: root.Certificate}); err != nil {
			return nil, err
		}
		n++
	}
	if n == 0 {
		return nil, errors.New("the CA bundle is empty")
	}
	return b.Bytes(), nil
}

// image is one platform's image: a single layer with the binary and the CA bundle.
func image(platform v1.Platform, binary string, ca []byte, when time.Time, annotations map[string]string) (v1.Image, error) {
	exe, err := os.ReadFile(binary)
	if err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	entries := []struct {
		name string
		mode int64
		body []byte
		dir  bool
	}{
		{name: "etc/", mode: 0o755, dir: true},
		{name: "etc/ssl/", mode: 0o755, dir: true},
		{name: "etc/ssl/certs/", mode: 0o755, dir: true},
		{name: caPath, mode: 0o644, body: ca},
		{name: binaryPath, mode: 0o755, body: exe},
	}
	for _, e := range entries {
		h := &tar.Header{Name: e.name, Mode: e.mode, ModTime: when, Format: tar.FormatPAX, Typeflag: tar.TypeReg, Size: int64(len(e.body))}
		if e.dir {
			h.Typeflag, h.Size = tar.TypeDir, 0
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, err
		}
		if _, err := tw.Write(e.body); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	layerBytes := buf.Bytes()
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerBytes)), nil
	}, tarball.WithMediaType(types.OCILayer), tarball.WithCompressionLevel(gzip.BestCompression))
	if err != nil {
		return nil, err
	}
	img := mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON)
	img, err = mutate.Append(img, mutate.Addendum{
		Layer:   layer,
		History: v1.History{Created: v1.Time{Time: when}, CreatedBy: "make image: /" + binaryPath + " and /" + caPath},
	})
	if err != nil {
		return nil, err
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cfg = cfg.DeepCopy()
	cfg.OS, cfg.Architecture, cfg.Variant = platform.OS, platform.Architecture, platform.Variant
	cfg.Created = v1.Time{Time: when}
	cfg.Config.User = user
	cfg.Config.Entrypoint = []string{"/" + binaryPath}
	cfg.Config.Env = []string{"SSL_CERT_FILE=/" + caPath}
	cfg.Config.Labels = map[string]string{}
	for k, v := range annotations {
		cfg.Config.Labels[k] = v
	}
	img, err = mutate.ConfigFile(img, cfg)
	if err != nil {
		return nil, err
	}
	return mutate.Annotations(img, annotations).(v1.Image), nil
}

// tarDir writes dir as a tar (an OCI archive when dir is an OCI layout), in name order, every
// entry owned by 0:0 and dated when.
func tarDir(dir, archive string, when time.Time) error {
	var paths []string
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || path == dir {
			return err
		}
		paths = append(paths, path)
		return nil
	})
	if err != nil {
		return err
	}
	sort.Strings(paths)
	f, err := os.Create(archive)
	if err != nil {
		return err
	}
	defer f.Close()
	tw := tar.NewWriter(f)
	for _, path := range paths {
		info, err := os.Stat(path)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, path)
		h := &tar.Header{Name: filepath.ToSlash(rel), ModTime: when, Format: tar.FormatPAX}
		if info.IsDir() {
			h.Name, h.Typeflag, h.Mode = h.Name+"/", tar.TypeDir, 0o755
		} else {
			h.Typeflag, h.Mode, h.Size = tar.TypeReg, 0o644, info.Size()
		}
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if !info.IsDir() {
			body, err := os.Open(path)
			if err != nil {
				return err
			}
			_, err = io.Copy(tw, body)
			body.Close()
			if err != nil {
				return err
			}
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	return f.Close()
}
