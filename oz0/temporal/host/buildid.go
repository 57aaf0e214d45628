package main

import (
	"crypto/sha256"
	"encoding/hex"
	"runtime/debug"

	sdkworker "go.temporal.io/sdk/worker"
	"go.temporal.io/server/common/headers"
)

// nameBuildForWorkers gives the SDK workers of Temporal's worker service (the scanners and
// other system workflows) the host's build ID. Without one, the first worker computes it
// as the MD5 of this whole executable (about 200 MB): at every host start that read took
// 0.36 CPU-s of the start's 0.79 (pprof of a start), and all of the file from disk when it
// is not cached. Temporal's own functional tests name theirs for the same reason
// (tests/testcore: SetBinaryChecksum("oss-server-test")).
//
// The ID still changes with the build: Temporal's version and a digest of what Go records
// in the binary about its build (the Go version, every module's version and checksum, the
// build's settings).
func nameBuildForWorkers() {
	id := "oz0-temporal-host-" + headers.ServerVersion
	if info, ok := debug.ReadBuildInfo(); ok {
		sum := sha256.Sum256([]byte(info.String()))
		id += "-" + hex.EncodeToString(sum[:8])
	}
	sdkworker.SetBinaryChecksum(id)
}
