// oz0-loadgen: many simulated nodes on the real edge protocol, cheaply, for benchmarks;
// and many API requests at once, each with a full TLS handshake.
//
//	oz0-loadgen join --edge HOST:PORT --ca CA.pem --nodes N --concurrency C --out DIR ...
//	oz0-loadgen hold --edge HOST:PORT [--edge ...] --ca CA.pem --nodes-dir DIR ...
//	oz0-loadgen posts --ca CA.pem --cert OPERATOR.crt --key OPERATOR.key --url URL ...
//
// Results are JSON on stdout, progress on stderr; a bad argument is one line on stderr
// and exit status 2. The join token comes only from OZ0_JOIN_TOKEN.
package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

const usage = `usage: oz0-loadgen join|hold|posts [options]   (oz0-loadgen COMMAND -h lists them)`

// usageError is bad input: one line, exit status 2.
type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

func main() {
	if len(os.Args) < 2 {
		fail(usageError{usage})
	}
	var err error
	switch os.Args[1] {
	case "join":
		err = runJoin(os.Args[2:])
	case "hold":
		err = runHold(os.Args[2:])
	case "posts":
		err = runPosts(os.Args[2:])
	default:
		err = usageError{fmt.Sprintf("unknown command %q; %s", os.Args[1], usage)}
	}
	if err != nil {
		fail(err)
	}
}

func fail(err error) {
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(0)
	}
	fmt.Fprintf(os.Stderr, "oz0-loadgen: error: %s\n", err)
	var ue usageError
	if errors.As(err, &ue) {
		os.Exit(2)
	}
	os.Exit(1)
}

// parse parses ARGS with FS; errors are one line, not the flag package's usage text.
func parse(fs *flag.FlagSet, args []string) error {
	fs.SetOutput(io.Discard)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fs.SetOutput(os.Stderr)
			fs.PrintDefaults()
			return err
		}
		return usageError{err.Error()}
	}
	if fs.NArg() > 0 {
		return usageError{fmt.Sprintf("unexpected argument %q", fs.Arg(0))}
	}
	return nil
}

// listFlag is a repeatable flag.
type listFlag []string

func (l *listFlag) String() string     { return strings.Join(*l, ",") }
func (l *listFlag) Set(v string) error { *l = append(*l, v); return nil }

func checkEdge(edge string) error {
	host, port, err := net.SplitHostPort(edge)
	if err != nil || host == "" {
		return usageError{fmt.Sprintf("--edge %q is not HOST:PORT", edge)}
	}
	if p, err := strconv.Atoi(port); err != nil || p < 1 || p > 65535 {
		return usageError{fmt.Sprintf("--edge %q: bad port", edge)}
	}
	return nil
}

// sources says where node i connects from: --source addresses in turn, or with
// --source-per-node A.B its own A.B.(i/250).(i%250+1), as bench.edge_load does (the edge
// admits 64 unauthenticated connections per source address; nodes are distinct machines).
type sources struct {
	list   listFlag
	prefix string
}

func (s *sources) register(fs *flag.FlagSet) {
	fs.Var(&s.list, "source", "local address to connect from, repeatable (round robin by node)")
	fs.StringVar(&s.prefix, "source-per-node", "", "A.B: node i connects from A.B.(i/250).(i%250+1) (loopback: 127.x)")
}

func (s *sources) check() error {
	for _, a := range s.list {
		if net.ParseIP(a) == nil {
			return usageError{fmt.Sprintf("--source %q is not an IP address", a)}
		}
	}
	if s.prefix != "" && net.ParseIP(s.prefix+".0.1").To4() == nil {
		return usageError{fmt.Sprintf("--source-per-node %q is not A.B", s.prefix)}
	}
	if s.prefix != "" && len(s.list) > 0 {
		return usageError{"give --source or --source-per-node, not both"}
	}
	return nil
}

// checkCount: --source-per-node names at most 256 * 250 addresses.
func (s *sources) checkCount(n int) error {
	if s.prefix != "" && n > 256*250 {
		return usageError{"--source-per-node gives at most 64000 nodes an address"}
	}
	return nil
}

func (s *sources) of(i int) string {
	switch {
	case s.prefix != "":
		return fmt.Sprintf("%s.%d.%d", s.prefix, i/250, i%250+1)
	case len(s.list) > 0:
		return s.list[i%len(s.list)]
	}
	return ""
}

// monotonic is CLOCK_MONOTONIC in seconds: Python's time.monotonic() on Linux.
func monotonic() float64 {
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	return float64(ts.Sec) + float64(ts.Nsec)/1e9
}

// output writes JSON lines to stdout, whole lines only, from any goroutine.
type output struct {
	mu sync.Mutex
}

var stdout output

func (o *output) line(v any) {
	raw, err := json.Marshal(v)
	if err != nil {
		panic(err) // only our own maps and structs are written
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	_, _ = os.Stdout.Write(append(raw, '\n'))
}

func progress(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "[oz0-loadgen %s] %s\n", time.Now().UTC().Format("15:04:05"),
		fmt.Sprintf(format, args...))
}

// percentiles of VALUES (seconds) in milliseconds, as bench/measure.py computes them.
func percentiles(values []float64) map[string]any {
	if len(values) == 0 {
		return map[string]any{"p50": nil, "p90": nil, "p99": nil, "max": nil}
	}
	sorted := append([]float64(nil), values...)
	slices.Sort(sorted)
	at := func(q float64) float64 {
		i := int(q * float64(len(sorted)))
		if i >= len(sorted) {
			i = len(sorted) - 1
		}
		return round1(sorted[i] * 1000)
	}
	return map[string]any{
		"p50": at(0.50), "p90": at(0.90), "p99": at(0.99), "max": round1(sorted[len(sorted)-1] * 1000),
	}
}

func round1(v float64) float64 { return float64(int64(v*10+0.5)) / 10 }
func round2(v float64) float64 { return float64(int64(v*100+0.5)) / 100 }
