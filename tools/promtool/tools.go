//go:build tools

// Package tools pins promtool, which `make test` uses to check the /metrics exposition
// (tests/operations.rs); the Makefile builds it from this module into target/tools/bin.
package tools

import _ "github.com/prometheus/prometheus/cmd/promtool"
