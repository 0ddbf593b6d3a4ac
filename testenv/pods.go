package main

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

// kwokStages is the lifecycle kwok plays on the fake nodes (see the file for what a test can ask).
//
//go:embed kwok-stages.yaml
var kwokStages []byte

// podSetup is how pods run: kube-scheduler places them on `nodes` fake nodes whose kubelet kwok
// simulates, so ReplicaSets scale, Deployments become Available and progress deadlines expire
// as on a real cluster, without containers.
type podSetup struct {
	nodes int
	kwok  string
}

// findKwok resolves the kwok binary: --kwok, else $TESTENV_KWOK, else kwok next to this binary
// (where `make testenv` puts it).
func (s *podSetup) findKwok() error {
	if s.kwok == "" {
		s.kwok = os.Getenv("TESTENV_KWOK")
	}
	if s.kwok == "" {
		self, err := os.Executable()
		if err != nil {
			return err
		}
		s.kwok = filepath.Join(filepath.Dir(self), "kwok")
	}
	if _, err := os.Stat(s.kwok); err != nil {
		return fmt.Errorf("kwok not found at %s (make testenv builds it; or pass --nodes 0 to run no pods): %w", s.kwok, err)
	}
	return nil
}

// nodeName is the name of fake node i.
func nodeName(i int) string { return fmt.Sprintf("testenv-node-%d", i) }

// registerNodes creates the fake nodes, as kubelets register themselves, and waits until kwok has
// made every one Ready (the scheduler places pods only there).
func (s podSetup) registerNodes(kubeconfig string, deadline time.Time) error {
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return err
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	for i := 0; i < s.nodes; i++ {
		node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{
			Name: nodeName(i),
			Labels: map[string]string{
				"kubernetes.io/hostname": nodeName(i),
				"kubernetes.io/os":       "linux",
				"kubernetes.io/arch":     "amd64",
				"type":                   "kwok",
			},
			Annotations: map[string]string{"kwok.x-k8s.io/node": "fake"},
		}}
		if _, err := client.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("register node %s: %w", node.Name, err)
		}
	}
	for {
		ready := 0
		list, err := client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		if err == nil {
			for _, n := range list.Items {
				for _, c := range n.Status.Conditions {
					if c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue {
						ready++
					}
				}
			}
		}
		if ready >= s.nodes {
			return nil
		}
		select {
		case <-ctx.Done():
			return errors.Join(fmt.Errorf("%d of %d kwok nodes Ready before the start timeout", ready, s.nodes), err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}
