// Test infrastructure only: the distribution registry with the storage the test bed's
// config uses (filesystem, and inmemory) instead of every driver: the registry's own main links
// the Azure, GCS and S3 drivers and their SDKs, most of its build (issue 35). The command line
// (`registry serve CONFIG`) is the registry's own (registry.RootCmd).
package main

import (
	"github.com/distribution/distribution/v3/registry"
	_ "github.com/distribution/distribution/v3/registry/storage/driver/filesystem"
	_ "github.com/distribution/distribution/v3/registry/storage/driver/inmemory"
)

func main() {
	// RootCmd prints its own error and exits non-zero on failure.
	_ = registry.RootCmd.Execute()
}
