// Command testenv runs a real, local Kubernetes control plane for reloader's tests and demo:
// etcd (embedded from go.etcd.io/etcd/server/v3), kube-apiserver, kube-controller-manager and
// kube-scheduler, all built from the official Kubernetes Go modules at the version pinned in
// go.mod, and kwok (built apart, in tools/kwok) playing the kubelet of a few fake nodes, so pods
// are scheduled and become Ready (see kwok-stages.yaml).
//
// One binary, several roles:
//
//	testenv up [--dir D] [--detach] [--exit-on-stdin-eof] [--nodes N]   start the control plane and supervise it
//	testenv down [--dir D]                                   stop it and remove its data
//	testenv status [--dir D]                                 exit 0 when it is running and ready
//	testenv compact [--dir D]                                compact etcd to its current revision
//	testenv version                                          print the Kubernetes version
//	testenv kubectl ARGS...                                  kubectl of the same version
//	testenv etcd | kube-apiserver | kube-controller-manager | kube-scheduler   the components (started by up)
//
// A symlink named kubectl to this binary is kubectl itself (make testenv creates one).
//
// Everything listens on 127.0.0.1 only, on free ports chosen at start and recorded in D/state.json.
package main

import (
	"fmt"
	"os"
	"path/filepath"

	_ "k8s.io/client-go/plugin/pkg/client/auth" // the auth plugins the kubectl binary has
	"k8s.io/component-base/cli"
	"k8s.io/component-base/logs"
	"k8s.io/component-base/version"
	kubectl "k8s.io/kubectl/pkg/cmd"
	kubectlutil "k8s.io/kubectl/pkg/cmd/util"
	apiserver "k8s.io/kubernetes/cmd/kube-apiserver/app"
	kcm "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	scheduler "k8s.io/kubernetes/cmd/kube-scheduler/app"
)

func main() {
	if filepath.Base(os.Args[0]) == "kubectl" {
		runKubectl(os.Args[1:])
	}
	if len(os.Args) < 2 {
		usage()
		os.Exit(2)
	}
	role, args := os.Args[1], os.Args[2:]
	var err error
	switch role {
	case "up":
		err = up(args)
	case "down":
		err = down(args)
	case "status":
		err = status(args)
	case "compact":
		err = compact(args)
	case "version":
		fmt.Println(version.Get().GitVersion)
	case "kubectl":
		runKubectl(args)
	case "etcd":
		err = runEtcd(args)
	case "kube-apiserver":
		cmd := apiserver.NewAPIServerCommand()
		cmd.SetArgs(args)
		err = cmd.Execute()
	case "kube-controller-manager":
		cmd := kcm.NewControllerManagerCommand()
		cmd.SetArgs(args)
		err = cmd.Execute()
	case "kube-scheduler":
		cmd := scheduler.NewSchedulerCommand()
		cmd.SetArgs(args)
		err = cmd.Execute()
	case "-h", "--help", "help":
		usage()
	default:
		usage()
		os.Exit(2)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "testenv %s: %v\n", role, err)
		os.Exit(1)
	}
}

func usage() {
	fmt.Fprint(os.Stderr, `testenv: a local Kubernetes control plane (etcd, kube-apiserver, kube-controller-manager,
kube-scheduler, and kwok for fake nodes that run pods)

usage:
  testenv up [--dir D] [--detach] [--exit-on-stdin-eof] [--timeout 180s] [--nodes 3] [--kwok PATH]
  testenv down [--dir D]
  testenv status [--dir D]
  testenv compact [--dir D]   compact etcd to its current revision (old watches get 410 Gone)
  testenv version
  testenv kubectl ARGS...   (or a symlink named kubectl) kubectl of the same version
`)
}

// runKubectl is cmd/kubectl's main: kubectl reads its arguments (plugins, verbosity) from
// os.Args, so they are rewritten to what a kubectl binary would see. It does not return.
func runKubectl(args []string) {
	os.Args = append([]string{"kubectl"}, args...)
	_, _ = logs.GlogSetter(kubectl.GetLogVerbosity(os.Args))
	if err := cli.RunNoErrOutput(kubectl.NewDefaultKubectlCommand()); err != nil {
		kubectlutil.CheckErr(err)
	}
	os.Exit(0)
}
