// Command testenv runs a real, local Kubernetes control plane for reloader's tests and demo:
// etcd (embedded from go.etcd.io/etcd/server/v3), kube-apiserver and kube-controller-manager, all
// built from the official Kubernetes Go modules at the version pinned in go.mod.
//
// One binary, several roles:
//
//	testenv up [--dir D] [--detach] [--exit-on-stdin-eof]   start the control plane and supervise it
//	testenv down [--dir D]                                   stop it and remove its data
//	testenv status [--dir D]                                 exit 0 when it is running and ready
//	testenv version                                          print the Kubernetes version
//	testenv etcd | kube-apiserver | kube-controller-manager  the components themselves (started by up)
//
// Everything listens on 127.0.0.1 only, on free ports chosen at start and recorded in D/state.json.
package main

import (
	"fmt"
	"os"

	"k8s.io/component-base/version"
	apiserver "k8s.io/kubernetes/cmd/kube-apiserver/app"
	kcm "k8s.io/kubernetes/cmd/kube-controller-manager/app"
)

func main() {
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
	case "version":
		fmt.Println(version.Get().GitVersion)
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
	fmt.Fprint(os.Stderr, `testenv: a local Kubernetes control plane (etcd, kube-apiserver, kube-controller-manager)

usage:
  testenv up [--dir D] [--detach] [--exit-on-stdin-eof] [--timeout 180s]
  testenv down [--dir D]
  testenv status [--dir D]
  testenv version
`)
}
