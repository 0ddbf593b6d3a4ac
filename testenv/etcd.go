package main

import (
	"flag"
	"fmt"
	"net/url"
	"os"
	"os/signal"
	"syscall"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
)

// runEtcd runs a single-member etcd server from the etcd server module until SIGTERM/SIGINT.
func runEtcd(args []string) error {
	fs := flag.NewFlagSet("etcd", flag.ContinueOnError)
	dataDir := fs.String("data-dir", "", "etcd data directory")
	clientURL := fs.String("listen-client-url", "http://127.0.0.1:2379", "client URL")
	peerURL := fs.String("listen-peer-url", "http://127.0.0.1:2380", "peer URL")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *dataDir == "" {
		return fmt.Errorf("--data-dir is required")
	}
	curl, err := url.Parse(*clientURL)
	if err != nil {
		return fmt.Errorf("--listen-client-url: %w", err)
	}
	purl, err := url.Parse(*peerURL)
	if err != nil {
		return fmt.Errorf("--listen-peer-url: %w", err)
	}

	cfg := embed.NewConfig()
	cfg.Name = "testenv"
	cfg.Dir = *dataDir
	cfg.ListenClientUrls = []url.URL{*curl}
	cfg.AdvertiseClientUrls = []url.URL{*curl}
	cfg.ListenPeerUrls = []url.URL{*purl}
	cfg.AdvertisePeerUrls = []url.URL{*purl}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	cfg.LogLevel = "warn"
	// A throwaway test store: durability across a machine crash is not needed, speed is.
	cfg.UnsafeNoFsync = true

	server, err := embed.StartEtcd(cfg)
	if err != nil {
		return fmt.Errorf("start etcd: %w", err)
	}
	defer server.Close()

	select {
	case <-server.Server.ReadyNotify():
		fmt.Fprintf(os.Stderr, "etcd ready on %s\n", curl)
	case <-time.After(60 * time.Second):
		server.Server.Stop()
		return fmt.Errorf("etcd did not become ready within 60s")
	}

	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	select {
	case <-stop:
		return nil
	case err := <-server.Err():
		return fmt.Errorf("etcd: %w", err)
	}
}
