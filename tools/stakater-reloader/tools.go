//go:build tools

// Package tools pins stakater/Reloader, built by `make bench-compare` into target/tools/bin
// to be measured beside this operator. Nothing of it is copied into the project.
package tools

import _ "github.com/stakater/Reloader"
