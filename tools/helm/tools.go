//go:build tools

// Package tools pins the helm CLI that `make helm` builds for chart lint and tests.
package tools

import _ "helm.sh/helm/v3/cmd/helm"
