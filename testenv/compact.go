package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// compact compacts the etcd of a running control plane to its current revision, so that every
// watch resumed from an older resource version gets 410 Gone (fault-injection tests use it).
func compact(args []string) error {
	fs := flag.NewFlagSet("compact", flag.ContinueOnError)
	dir := fs.String("dir", defaultDir(), "state directory")
	if err := fs.Parse(args); err != nil {
		return err
	}
	l := newLayout(*dir)
	st, err := readState(l)
	if err != nil {
		return fmt.Errorf("no running control plane in %s: %w", l.dir, err)
	}
	client, err := clientv3.New(clientv3.Config{Endpoints: []string{st.Etcd}, DialTimeout: 5 * time.Second})
	if err != nil {
		return fmt.Errorf("connect to etcd at %s: %w", st.Etcd, err)
	}
	defer client.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// Any read answers with the store's current revision in its header.
	resp, err := client.Get(ctx, "/", clientv3.WithCountOnly())
	if err != nil {
		return fmt.Errorf("read the etcd revision: %w", err)
	}
	rev := resp.Header.Revision
	_, err = client.Compact(ctx, rev, clientv3.WithCompactPhysical())
	// The API server compacts on its own too; a revision already compacted is the same outcome.
	if err != nil && !errors.Is(err, rpctypes.ErrCompacted) {
		return fmt.Errorf("compact etcd to revision %d: %w", rev, err)
	}
	fmt.Printf("testenv: compacted etcd to revision %d\n", rev)
	return nil
}
