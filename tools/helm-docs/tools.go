//go:build tools

// Package tools pins helm-docs, which generates helm/reloader/README.md from the chart's
// values comments (`make chart-docs`); built like tools/helm.
package tools

import _ "github.com/norwoodj/helm-docs/cmd/helm-docs"
