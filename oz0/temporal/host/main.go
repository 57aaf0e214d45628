// Command oz0-temporal-host embeds Temporal's server for orchestrator-zero.
//
//	oz0-temporal-host version
//	oz0-temporal-host setup-schema   < config.json   (one line)
//	oz0-temporal-host serve          < config line, then command lines
//
// stdout carries only one-line JSON messages for the parent; every log goes to stderr.
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"runtime"
	"sync"
	"syscall"

	"go.temporal.io/server/common/headers"
	"go.temporal.io/server/common/log"
)

// out is the protocol channel: the original stdout. fd 1 itself is pointed at stderr so
// that nothing else in the process (library prints, panics) can corrupt the protocol.
var (
	out   *os.File
	outMu sync.Mutex
)

func initOut() {
	fd, err := syscall.Dup(1)
	if err != nil {
		out = os.Stdout
		return
	}
	syscall.CloseOnExec(fd)
	out = os.NewFile(uintptr(fd), "protocol")
	_ = syscall.Dup3(2, 1, 0)
}

func emit(v any) {
	b, err := json.Marshal(v)
	if err != nil {
		b = []byte(fmt.Sprintf(`{"event":"error","error":%q}`, err.Error()))
	}
	outMu.Lock()
	defer outMu.Unlock()
	_, _ = out.Write(append(b, '\n'))
}

func fail(err error) {
	emit(map[string]any{"event": "error", "error": err.Error()})
	os.Exit(1)
}

// readLine reads one newline-terminated line (the last line may lack the newline).
func readLine(r *bufio.Reader) ([]byte, error) {
	line, err := r.ReadBytes('\n')
	if err == io.EOF && len(line) > 0 {
		return line, nil
	}
	return line, err
}

func newLogger(level string) log.Logger {
	// log.Config.Stdout=false: Temporal's zap logger writes JSON lines to stderr.
	return log.NewZapLogger(log.BuildZapLogger(log.Config{Level: level, Format: "json"}))
}

func main() {
	initOut()
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: oz0-temporal-host version|setup-schema|serve  (config: one JSON line on stdin)")
		os.Exit(2)
	}
	switch os.Args[1] {
	case "version":
		emit(map[string]string{"temporalServer": headers.ServerVersion, "go": runtime.Version()})
		return
	case "setup-schema", "serve":
	default:
		fmt.Fprintf(os.Stderr, "unknown subcommand %q\n", os.Args[1])
		os.Exit(2)
	}

	in := bufio.NewReaderSize(os.Stdin, 1<<16)
	line, err := readLine(in)
	if err != nil {
		fail(fmt.Errorf("reading config from stdin: %w", err))
	}
	cfg, err := parseConfig(line)
	if err != nil {
		fail(err)
	}

	switch os.Args[1] {
	case "setup-schema":
		if err := cfg.validateDB(); err != nil {
			fail(err)
		}
		res, err := setupSchemas(cfg, newLogger(cfg.LogLevel))
		if err != nil {
			emit(map[string]any{"ok": false, "error": err.Error(), "databases": res})
			os.Exit(1)
		}
		emit(map[string]any{"ok": true, "databases": res})
	case "serve":
		if err := cfg.validateServe(); err != nil {
			fail(err)
		}
		os.Exit(serve(cfg, in))
	}
}
