//go:build tools

// crane, from the same pinned go-containerregistry, pushes the image the release workflow
// publishes (`make crane`).
package main

import _ "github.com/google/go-containerregistry/cmd/crane"
