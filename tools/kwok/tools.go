//go:build tools

// Package tools pins kwok (sigs.k8s.io/kwok), the Kubernetes SIGs node simulator that makes
// testenv's fake nodes run pods: `make testenv` builds it next to the control plane.
package tools

import _ "sigs.k8s.io/kwok/cmd/kwok"
