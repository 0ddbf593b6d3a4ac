package main

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"k8s.io/component-base/version"
)

// The controllers a pod-template change needs to turn into ReplicaSets and ControllerRevisions
// exactly as on a real cluster, plus the ones that make namespaces behave (deletion, default
// service account, kube-root-ca.crt).
var controllers = []string{
	"deployment-controller",
	"replicaset-controller",
	"statefulset-controller",
	"daemonset-controller",
	"job-controller",
	"cronjob-controller",
	"garbage-collector-controller",
	"namespace-controller",
	"serviceaccount-controller",
	"serviceaccount-token-controller",
	"root-ca-certificate-publisher-controller",
	"ttl-after-finished-controller",
	"disruption-controller",     // PodDisruptionBudgets' status, which the Eviction API checks
	"node-lifecycle-controller", // lifts the not-ready taint a new node is created with once kwok reports it Ready
}

// state is written to D/state.json; ready is true once every component answers its health check.
type state struct {
	Supervisor int            `json:"supervisorPid"`
	Version    string         `json:"version"`
	APIServer  string         `json:"apiServer"`
	Etcd       string         `json:"etcd"`
	Kubeconfig string         `json:"kubeconfig"`
	Components map[string]int `json:"components"`
	Restarts   map[string]int `json:"restarts"`
	Ready      bool           `json:"ready"`
}

type layout struct {
	dir, data, logs, kubeconfig, stateFile, pidFile string
}

func newLayout(dir string) layout {
	abs, err := filepath.Abs(dir)
	if err == nil {
		dir = abs
	}
	return layout{
		dir:        dir,
		data:       filepath.Join(dir, "data"),
		logs:       filepath.Join(dir, "logs"),
		kubeconfig: filepath.Join(dir, "kubeconfig"),
		stateFile:  filepath.Join(dir, "state.json"),
		pidFile:    filepath.Join(dir, "testenv.pid"),
	}
}

// removeData deletes everything a run leaves except the logs (kept for debugging).
func (l layout) removeData() {
	for _, p := range []string{l.data, l.kubeconfig, l.stateFile, l.pidFile} {
		_ = os.RemoveAll(p)
	}
}

type multiFlag []string

func (m *multiFlag) String() string     { return strings.Join(*m, " ") }
func (m *multiFlag) Set(v string) error { *m = append(*m, v); return nil }

func defaultDir() string {
	if d := os.Getenv("TESTENV_DIR"); d != "" {
		return d
	}
	return filepath.Join("target", "testenv")
}

func up(args []string) error {
	fs := flag.NewFlagSet("up", flag.ContinueOnError)
	dir := fs.String("dir", defaultDir(), "state directory (kubeconfig, data, logs)")
	detach := fs.Bool("detach", false, "start in the background and return once ready")
	stdinEOF := fs.Bool("exit-on-stdin-eof", false, "stop when standard input closes (for test harnesses)")
	ephemeral := fs.Bool("ephemeral", false, "remove the whole state directory, logs included, on stop")
	timeout := fs.Duration("timeout", 180*time.Second, "how long to wait for readiness")
	nodes := fs.Int("nodes", 3, "fake nodes run by kwok, with kube-scheduler, so pods run (0: neither runs; pods stay Pending)")
	kwokBin := fs.String("kwok", "", "the kwok binary (default: kwok next to this binary, or $TESTENV_KWOK)")
	var apiArgs, kcmArgs multiFlag
	fs.Var(&apiArgs, "apiserver-arg", "extra kube-apiserver flag (repeatable)")
	fs.Var(&kcmArgs, "controller-manager-arg", "extra kube-controller-manager flag (repeatable)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	l := newLayout(*dir)
	if err := os.MkdirAll(l.logs, 0o755); err != nil {
		return err
	}

	if pid, ok := runningSupervisor(l); ok {
		st, _ := readState(l)
		if st != nil && st.Ready {
			fmt.Printf("testenv: already running (pid %d), kube-apiserver %s at %s\n", pid, st.Version, st.APIServer)
			return nil
		}
		if !*detach {
			return fmt.Errorf("another supervisor (pid %d) is starting in %s", pid, l.dir)
		}
		return waitReadyFile(l, nil, *timeout)
	}

	if *detach {
		return startDetached(l, args, *timeout)
	}
	pods := podSetup{nodes: *nodes, kwok: *kwokBin}
	if pods.nodes > 0 {
		if err := pods.findKwok(); err != nil {
			return err
		}
	}
	return supervise(l, *stdinEOF, *ephemeral, *timeout, apiArgs, kcmArgs, pods)
}

// startDetached re-executes `up` without --detach in a new session and waits for it to be ready.
func startDetached(l layout, args []string, timeout time.Duration) error {
	self, err := os.Executable()
	if err != nil {
		return err
	}
	var childArgs []string
	for _, a := range args {
		if a != "--detach" && a != "-detach" && a != "--detach=true" {
			childArgs = append(childArgs, a)
		}
	}
	logPath := filepath.Join(l.logs, "testenv.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		return err
	}
	defer logFile.Close()
	cmd := exec.Command(self, append([]string{"up"}, childArgs...)...)
	cmd.Stdout, cmd.Stderr, cmd.Stdin = logFile, logFile, nil
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return err
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	fmt.Printf("testenv: starting control plane in the background (pid %d, log %s)\n", cmd.Process.Pid, logPath)
	if err := waitReadyFile(l, exited, timeout); err != nil {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		tail, _ := os.ReadFile(logPath)
		fmt.Fprintf(os.Stderr, "---- %s ----\n%s\n", logPath, lastLines(string(tail), 40))
		return err
	}
	return nil
}

func waitReadyFile(l layout, exited <-chan error, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		select {
		case err := <-exited:
			return fmt.Errorf("control plane supervisor exited before ready: %v", err)
		default:
		}
		if st, err := readState(l); err == nil && st.Ready {
			fmt.Printf("testenv: ready: kube-apiserver %s at %s\ntestenv: kubeconfig %s\n", st.Version, st.APIServer, st.Kubeconfig)
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("control plane not ready after %s", timeout)
}

// component is one supervised child process: the same binary in another role.
type component struct {
	name string
	bin  string // another program (kwok); empty: this binary in the role `name`
	args []string
	log  string

	mu       sync.Mutex
	cmd      *exec.Cmd
	done     chan struct{}
	stopping bool
	restarts int
}

func (c *component) start() error {
	self, err := os.Executable()
	if err != nil {
		return err
	}
	logFile, err := os.OpenFile(c.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	cmd := exec.Command(self, append([]string{c.name}, c.args...)...)
	if c.bin != "" {
		cmd = exec.Command(c.bin, c.args...)
	}
	cmd.Stdout, cmd.Stderr = logFile, logFile
	// If the supervisor dies without cleaning up, the kernel takes its children with it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		logFile.Close()
		return fmt.Errorf("start %s: %w", c.name, err)
	}
	done := make(chan struct{})
	c.mu.Lock()
	c.cmd, c.done = cmd, done
	c.mu.Unlock()
	go func() {
		_ = cmd.Wait()
		logFile.Close()
		close(done)
	}()
	return nil
}

func (c *component) pid() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cmd == nil || c.cmd.Process == nil {
		return 0
	}
	return c.cmd.Process.Pid
}

func (c *component) exitedChan() chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.done
}

// stop sends SIGTERM, then SIGKILL after grace.
func (c *component) stop(grace time.Duration) {
	c.mu.Lock()
	c.stopping = true
	cmd, done := c.cmd, c.done
	c.mu.Unlock()
	if cmd == nil || cmd.Process == nil {
		return
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-done:
	case <-time.After(grace):
		_ = cmd.Process.Kill()
		<-done
	}
}

// step is one component to start and how to tell it is healthy.
type step struct {
	c      *component
	health func() bool
}

func supervise(l layout, stdinEOF, ephemeral bool, timeout time.Duration, apiArgs, kcmArgs []string, pods podSetup) error {
	// The harness reading our stdout may exit before we do; a broken pipe must not kill the
	// supervisor before it has stopped the components and removed the data. (Notify, not
	// Ignore: an ignored signal would be inherited by the components.)
	signal.Notify(make(chan os.Signal, 1), syscall.SIGPIPE)

	started := time.Now()
	l.removeData() // a crashed earlier run may have left data behind; every start is a fresh cluster
	if err := os.MkdirAll(l.data, 0o700); err != nil {
		return err
	}
	if err := os.WriteFile(l.pidFile, []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil {
		return err
	}
	var components []*component
	cleanup := func() {
		for i := len(components) - 1; i >= 0; i-- {
			components[i].stop(15 * time.Second)
		}
		l.removeData()
		if ephemeral {
			_ = os.RemoveAll(l.dir)
		}
	}

	p, err := newPKI(filepath.Join(l.data, "pki"))
	if err != nil {
		cleanup()
		return fmt.Errorf("generate certificates: %w", err)
	}
	ports, err := freePorts(6)
	if err != nil {
		cleanup()
		return err
	}
	etcdClient := fmt.Sprintf("http://127.0.0.1:%d", ports[0])
	etcdPeer := fmt.Sprintf("http://127.0.0.1:%d", ports[1])
	apiURL := fmt.Sprintf("https://127.0.0.1:%d", ports[2])
	kcmURL := fmt.Sprintf("https://127.0.0.1:%d", ports[3])
	kcmKubeconfig := filepath.Join(l.data, "kube-controller-manager.kubeconfig")
	if err := writeKubeconfig(kcmKubeconfig, apiURL, p.CACert, p.KCMCert, p.KCMKey, "kube-controller-manager"); err != nil {
		cleanup()
		return err
	}
	schedURL := fmt.Sprintf("https://127.0.0.1:%d", ports[4])
	kwokURL := fmt.Sprintf("http://127.0.0.1:%d", ports[5])
	schedKubeconfig := filepath.Join(l.data, "kube-scheduler.kubeconfig")
	kwokKubeconfig := filepath.Join(l.data, "kwok.kubeconfig")
	kwokConfig := filepath.Join(l.data, "kwok-stages.yaml")
	if pods.nodes > 0 {
		err := errors.Join(
			writeKubeconfig(schedKubeconfig, apiURL, p.CACert, p.SchedCert, p.SchedKey, "kube-scheduler"),
			writeKubeconfig(kwokKubeconfig, apiURL, p.CACert, p.AdminCert, p.AdminKey, "kwok"),
			os.WriteFile(kwokConfig, kwokStages, 0o644),
		)
		if err != nil {
			cleanup()
			return err
		}
	}

	etcd := &component{name: "etcd", log: filepath.Join(l.logs, "etcd.log"), args: []string{
		"--data-dir=" + filepath.Join(l.data, "etcd"),
		"--listen-client-url=" + etcdClient,
		"--listen-peer-url=" + etcdPeer,
	}}
	api := &component{name: "kube-apiserver", log: filepath.Join(l.logs, "kube-apiserver.log"), args: append([]string{
		"--etcd-servers=" + etcdClient,
		"--bind-address=127.0.0.1",
		"--advertise-address=127.0.0.1",
		"--secure-port=" + strconv.Itoa(ports[2]),
		"--tls-cert-file=" + p.ServingCert,
		"--tls-private-key-file=" + p.ServingKey,
		"--client-ca-file=" + p.CACert,
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file=" + p.SAPublicKey,
		"--service-account-signing-key-file=" + p.SAPrivateKey,
		"--service-cluster-ip-range=10.0.0.0/24",
		"--authorization-mode=RBAC",
		"--endpoint-reconciler-type=none",
		"--allow-privileged=true",
		"--profiling=false",
		"--v=1",
	}, apiArgs...)}
	kcm := &component{name: "kube-controller-manager", log: filepath.Join(l.logs, "kube-controller-manager.log"), args: append([]string{
		"--kubeconfig=" + kcmKubeconfig,
		"--authentication-kubeconfig=" + kcmKubeconfig,
		"--authorization-kubeconfig=" + kcmKubeconfig,
		"--bind-address=127.0.0.1",
		"--secure-port=" + strconv.Itoa(ports[3]),
		"--tls-cert-file=" + p.ServingCert,
		"--tls-private-key-file=" + p.ServingKey,
		"--leader-elect=false",
		"--controllers=" + strings.Join(controllers, ","),
		"--service-account-private-key-file=" + p.SAPrivateKey,
		"--root-ca-file=" + p.CACert,
		"--use-service-account-credentials=false",
		"--profiling=false",
		"--v=1",
	}, kcmArgs...)}

	sched := &component{name: "kube-scheduler", log: filepath.Join(l.logs, "kube-scheduler.log"), args: []string{
		"--kubeconfig=" + schedKubeconfig,
		"--authentication-kubeconfig=" + schedKubeconfig,
		"--authorization-kubeconfig=" + schedKubeconfig,
		"--bind-address=127.0.0.1",
		"--secure-port=" + strconv.Itoa(ports[4]),
		"--tls-cert-file=" + p.ServingCert,
		"--tls-private-key-file=" + p.ServingKey,
		"--leader-elect=false",
		"--profiling=false",
		"--v=1",
	}}
	kwok := &component{name: "kwok", bin: pods.kwok, log: filepath.Join(l.logs, "kwok.log"), args: []string{
		"--kubeconfig=" + kwokKubeconfig,
		"--config=" + kwokConfig,
		"--manage-all-nodes=true",
		"--server-address=127.0.0.1:" + strconv.Itoa(ports[5]),
		"--node-lease-duration-seconds=40",
		"--v=WARN",
	}}

	client, err := healthClient(p)
	if err != nil {
		cleanup()
		return err
	}
	st := &state{
		Supervisor: os.Getpid(), Version: version.Get().GitVersion, APIServer: apiURL, Etcd: etcdClient,
		Kubeconfig: l.kubeconfig, Components: map[string]int{}, Restarts: map[string]int{},
	}

	// Start in dependency order, each one healthy before the next.
	steps := []step{
		{etcd, func() bool { return get(client, etcdClient+"/health") }},
		{api, func() bool { return get(client, apiURL+"/readyz") }},
		{kcm, func() bool { return get(client, kcmURL+"/healthz") }},
	}
	if pods.nodes > 0 {
		steps = append(steps,
			step{sched, func() bool { return get(client, schedURL+"/healthz") }},
			step{kwok, func() bool { return get(client, kwokURL+"/healthz") }},
		)
	}
	deadline := started.Add(timeout)
	for _, step := range steps {
		if err := step.c.start(); err != nil {
			cleanup()
			return err
		}
		components = append(components, step.c)
		st.Components[step.c.name] = step.c.pid()
		for !step.health() {
			select {
			case <-step.c.exitedChan():
				cleanup()
				tail, _ := os.ReadFile(step.c.log)
				return fmt.Errorf("%s exited during start; last lines of %s:\n%s", step.c.name, step.c.log, lastLines(string(tail), 30))
			case <-time.After(100 * time.Millisecond):
			}
			if time.Now().After(deadline) {
				cleanup()
				return fmt.Errorf("%s not healthy after %s (log: %s)", step.c.name, timeout, step.c.log)
			}
		}
		fmt.Printf("testenv: %s healthy after %.1fs\n", step.c.name, time.Since(started).Seconds())
	}
	if err := writeKubeconfig(l.kubeconfig, apiURL, p.CACert, p.AdminCert, p.AdminKey, "admin"); err != nil {
		cleanup()
		return err
	}
	if pods.nodes > 0 {
		if err := pods.registerNodes(l.kubeconfig, deadline); err != nil {
			cleanup()
			return err
		}
		fmt.Printf("testenv: %d kwok nodes Ready after %.1fs\n", pods.nodes, time.Since(started).Seconds())
	}
	st.Ready = true
	var stateMu sync.Mutex
	writeState := func() {
		stateMu.Lock()
		defer stateMu.Unlock()
		for _, c := range components {
			st.Components[c.name] = c.pid()
			st.Restarts[c.name] = c.restarts
		}
		_ = writeJSON(l.stateFile, st)
	}
	writeState()
	fmt.Printf("testenv: kube-apiserver %s ready at %s after %.1fs; kubeconfig %s\n",
		st.Version, apiURL, time.Since(started).Seconds(), l.kubeconfig)

	stop := make(chan string, 4)
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
	go func() { s := <-sigs; stop <- "signal " + s.String() }()
	if stdinEOF {
		go func() { _, _ = io.Copy(io.Discard, bufio.NewReader(os.Stdin)); stop <- "stdin closed" }()
	}
	// A component that dies after start (a fault-injection test may kill the API server on
	// purpose) is restarted with the same flags and ports, its data kept.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for _, c := range components {
		go func(c *component) {
			for {
				select {
				case <-ctx.Done():
					return
				case <-c.exitedChan():
				}
				c.mu.Lock()
				stopping := c.stopping
				c.mu.Unlock()
				if stopping || ctx.Err() != nil {
					return
				}
				fmt.Printf("testenv: %s exited; restarting\n", c.name)
				time.Sleep(200 * time.Millisecond)
				if err := c.start(); err != nil {
					fmt.Printf("testenv: restart %s: %v\n", c.name, err)
					stop <- "restart failed"
					return
				}
				c.mu.Lock()
				c.restarts++
				c.mu.Unlock()
				writeState()
			}
		}(c)
	}

	reason := <-stop
	fmt.Printf("testenv: stopping (%s)\n", reason)
	cancel()
	cleanup()
	fmt.Println("testenv: stopped; data removed")
	return nil
}

func healthClient(p *pki) (*http.Client, error) {
	caPEM, err := os.ReadFile(p.CACert)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return nil, errors.New("bad CA certificate")
	}
	cert, err := tls.LoadX509KeyPair(p.AdminCert, p.AdminKey)
	if err != nil {
		return nil, err
	}
	return &http.Client{
		Timeout: 2 * time.Second,
		Transport: &http.Transport{TLSClientConfig: &tls.Config{
			RootCAs: pool, Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12,
		}},
	}, nil
}

func get(c *http.Client, url string) bool {
	resp, err := c.Get(url)
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode == http.StatusOK
}

func freePorts(n int) ([]int, error) {
	var ports []int
	var listeners []net.Listener
	defer func() {
		for _, l := range listeners {
			l.Close()
		}
	}()
	for i := 0; i < n; i++ {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("find a free port: %w", err)
		}
		listeners = append(listeners, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

func down(args []string) error {
	fs := flag.NewFlagSet("down", flag.ContinueOnError)
	dir := fs.String("dir", defaultDir(), "state directory")
	if err := fs.Parse(args); err != nil {
		return err
	}
	l := newLayout(*dir)
	st, _ := readState(l)
	pid, running := runningSupervisor(l)
	if running {
		_ = syscall.Kill(pid, syscall.SIGTERM)
		deadline := time.Now().Add(60 * time.Second)
		for alive(pid) && time.Now().Before(deadline) {
			time.Sleep(100 * time.Millisecond)
		}
		if alive(pid) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
	// Whatever happened to the supervisor, no component outlives `down`.
	if st != nil {
		for name, cpid := range st.Components {
			if alive(cpid) && isTestenv(cpid) {
				fmt.Printf("testenv: killing leftover %s (pid %d)\n", name, cpid)
				_ = syscall.Kill(cpid, syscall.SIGKILL)
			}
		}
	}
	l.removeData()
	if running {
		fmt.Println("testenv: stopped; data removed")
	} else {
		fmt.Println("testenv: not running; data removed")
	}
	return nil
}

func status(args []string) error {
	fs := flag.NewFlagSet("status", flag.ContinueOnError)
	dir := fs.String("dir", defaultDir(), "state directory")
	if err := fs.Parse(args); err != nil {
		return err
	}
	l := newLayout(*dir)
	pid, ok := runningSupervisor(l)
	st, _ := readState(l)
	if !ok || st == nil || !st.Ready {
		return errors.New("not running")
	}
	fmt.Printf("running (pid %d): kube-apiserver %s at %s, kubeconfig %s\n", pid, st.Version, st.APIServer, st.Kubeconfig)
	return nil
}

func runningSupervisor(l layout) (int, bool) {
	raw, err := os.ReadFile(l.pidFile)
	if err != nil {
		return 0, false
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(raw)))
	if err != nil || !alive(pid) || !isTestenv(pid) {
		return 0, false
	}
	return pid, true
}

func alive(pid int) bool {
	if pid <= 0 {
		return false
	}
	if err := syscall.Kill(pid, 0); err != nil {
		return false
	}
	// A zombie is not alive.
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	fields := strings.Fields(string(raw[strings.LastIndexByte(string(raw), ')')+1:]))
	return len(fields) == 0 || fields[0] != "Z"
}

func isTestenv(pid int) bool {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		return false
	}
	argv0 := strings.SplitN(string(raw), "\x00", 2)[0]
	return filepath.Base(argv0) == "testenv"
}

func readState(l layout) (*state, error) {
	raw, err := os.ReadFile(l.stateFile)
	if err != nil {
		return nil, err
	}
	var st state
	if err := json.Unmarshal(raw, &st); err != nil {
		return nil, err
	}
	return &st, nil
}

func writeJSON(path string, v any) error {
	raw, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, raw, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

func encodeBase64(b []byte) string { return base64.StdEncoding.EncodeToString(b) }

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
