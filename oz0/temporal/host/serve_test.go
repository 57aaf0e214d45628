package main

import (
	"errors"
	"os"
	"os/exec"
	"syscall"
	"testing"
)

// A host whose server died writes its stop's log lines to a pipe nobody reads: it must
// live on to finish the stop, not die of SIGPIPE (what Go does by default on fd 1 and 2).
func TestAWriteToADeadServersPipeDoesNotKillTheHost(t *testing.T) {
	if os.Getenv("OZ0_HOST_PIPE_CHILD") != "" {
		if os.Getenv("OZ0_HOST_PIPE_CHILD") == "survive" {
			surviveBrokenPipes()
		}
		for i := 0; i < 3; i++ {
			_, _ = os.Stderr.WriteString("a log line nobody reads\n")
		}
		os.Exit(0)
	}
	for _, mode := range []string{"survive", "default"} {
		r, w, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		_ = r.Close() // the reader is gone, as a SIGKILLed server is
		cmd := exec.Command(os.Args[0], "-test.run=^TestAWriteToADeadServersPipeDoesNotKillTheHost$")
		cmd.Env = append(os.Environ(), "OZ0_HOST_PIPE_CHILD="+mode)
		cmd.Stderr = w
		err = cmd.Run()
		_ = w.Close()
		var exit *exec.ExitError
		killed := errors.As(err, &exit) && exit.Sys().(syscall.WaitStatus).Signal() == syscall.SIGPIPE
		if mode == "survive" && err != nil {
			t.Fatalf("with surviveBrokenPipes the host ended: %v", err)
		}
		if mode == "default" && !killed {
			// The check itself: without it, Go's default must kill (else this test shows nothing).
			t.Fatalf("without surviveBrokenPipes the child was not killed by SIGPIPE: %v", err)
		}
	}
}
