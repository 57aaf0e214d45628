package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"go.temporal.io/server/common/dynamicconfig"
	"go.temporal.io/server/common/headers"
	"go.temporal.io/server/temporal"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// command is one stdin line after the config.
//
//	{"id":1,"op":"ping"}
//	{"id":2,"op":"authz","replace":true,"nodes":{"n1":{"tenant":"default","state":"accepted","keySha256":"9f86…"}}}
//	{"id":3,"op":"authz","nodes":{"n1":{"tenant":"default","state":"blocked","keySha256":"9f86…"},"n2":null}}
//	{"id":4,"op":"operators","operators":{"alice":{"serial":"123456789","role":"viewer","tenants":["acme"]}}}
//	{"id":5,"op":"tls","frontendCert":"...","frontendKey":"...","internodeCert":"...","internodeKey":"..."}
//	{"id":6,"op":"stop"}
//
// "authz" entries name the key of the node's current certificate (keySha256, hex SHA-256 of
// its DER SubjectPublicKeyInfo): only a certificate for that key may call, and a new key
// cancels the calls in flight of the old one.
// "operators" replaces the table of operators' grants: the serial (decimal) of each one's
// current certificate, its role and its tenants (none: every tenant). Only those
// certificates may call, and only to read in their tenants' namespaces (operatorapi.go);
// calls in flight of an operator whose grant changed, or with any other certificate, are
// cancelled.
//
// Every command with an id is answered by exactly one stdout line {"ack":<id>, ...};
// a failed one carries "error". EOF on stdin = stop.
type command struct {
	ID            json.RawMessage           `json:"id"`
	Op            string                    `json:"op"`
	Nodes         map[string]*NodeEntry     `json:"nodes"`
	Replace       bool                      `json:"replace"`
	Operators     map[string]*OperatorGrant `json:"operators"`
	FrontendCert  string                    `json:"frontendCert"`
	FrontendKey   string                    `json:"frontendKey"`
	InternodeCert string                    `json:"internodeCert"`
	InternodeKey  string                    `json:"internodeKey"`
}

func ack(id json.RawMessage, extra map[string]any) {
	m := map[string]any{"ack": id}
	for k, v := range extra {
		m[k] = v
	}
	emit(m)
}

// surviveBrokenPipes: our stdout and stderr are pipes to the server. When the server dies
// (SIGKILL), stdin's EOF starts a graceful stop, whose first log line meets a broken pipe:
// Go's default for a write to fd 1 or 2 then is to die of SIGPIPE, before the host has
// left Temporal's membership, and the other hosts wait out the membership timeout for its
// shards. Ignored, the write fails (the line is lost with its reader) and the stop finishes.
func surviveBrokenPipes() {
	signal.Ignore(syscall.SIGPIPE)
}

func serve(cfg *HostConfig, in *bufio.Reader) int {
	t0 := time.Now()
	logger := newLogger(cfg.LogLevel)
	nameBuildForWorkers()

	tlsp, err := newMemTLS(cfg.TLS)
	if err != nil {
		fail(err)
	}
	table := newAuthz(cfg.Nodes)
	table.setOperators(cfg.Operators)

	surviveBrokenPipes()

	// stop reasons: "eof", "stop", "signal"
	stopCh := make(chan string, 4)
	go func() {
		sig := make(chan os.Signal, 1)
		signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
		s := <-sig
		stopCh <- "signal:" + s.String()
	}()
	go readCommands(in, table, tlsp, stopCh)

	dc := dynamicconfig.StaticClient{}
	for k, v := range cfg.DynamicConfig {
		dc[dynamicconfig.MakeKey(k)] = v
	}

	mainStore := newSharedMainStore(logger)
	srv, err := temporal.NewServer(
		temporal.WithConfig(cfg.temporalConfig()),
		temporal.WithPersistenceFactoryProvider(mainStore.provider),
		temporal.ForServices(allServices),
		temporal.WithLogger(logger),
		temporal.WithTLSConfigFactory(tlsp),
		temporal.WithClaimMapper(claimMapperFactory),
		temporal.WithAuthorizer(newAuthorizer(table, logger)),
		temporal.WithChainedFrontendGrpcInterceptors(table.interceptor, newStickyGone().interceptor),
		temporal.WithDynamicConfigClient(dc),
	)
	if err != nil {
		fail(fmt.Errorf("temporal.NewServer: %w", err))
	}

	started := make(chan error, 1)
	go func() { started <- srv.Start() }()

	readyCtx, cancelReady := context.WithTimeout(context.Background(), time.Duration(cfg.ReadyTimeoutSeconds)*time.Second)
	defer cancelReady()
	select {
	case err := <-started:
		if err != nil {
			fail(fmt.Errorf("temporal server start: %w", err))
		}
	case reason := <-stopCh:
		// A half-started server cannot be stopped cleanly; leaving is safe (the membership
		// row simply expires).
		emit(map[string]any{"event": "stopped", "reason": reason, "during": "start"})
		return 0
	case <-readyCtx.Done():
		fail(errors.New("timed out starting Temporal server"))
	}
	reason, err := waitFrontend(readyCtx, cfg, tlsp, stopCh)
	if err != nil {
		fail(err)
	}
	if reason == "" {
		emit(map[string]any{
			"event":          "serving",
			"frontend":       net.JoinHostPort(cfg.Advertise, strconv.Itoa(cfg.Ports.Frontend)),
			"temporalServer": headers.ServerVersion,
			"startMs":        time.Since(t0).Milliseconds(),
		})
		reason = <-stopCh
	}
	emit(map[string]any{"event": "stopping", "reason": reason})
	watchdog := time.AfterFunc(time.Duration(cfg.StopTimeoutSeconds)*time.Second, func() {
		emit(map[string]any{"event": "stopped", "reason": reason, "forced": true})
		os.Exit(3)
	})
	err = srv.Stop()
	mainStore.close()
	watchdog.Stop()
	if err != nil {
		emit(map[string]any{"event": "stopped", "reason": reason, "error": err.Error()})
		return 1
	}
	emit(map[string]any{"event": "stopped", "reason": reason})
	return 0
}

// waitFrontend polls the frontend's gRPC health service over mTLS until WorkflowService is
// SERVING. It returns a non-empty stop reason if a stop was requested meanwhile.
func waitFrontend(ctx context.Context, cfg *HostConfig, tlsp *memTLS, stopCh chan string) (string, error) {
	addr := net.JoinHostPort(cfg.Advertise, strconv.Itoa(cfg.Ports.Frontend))
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(tlsp.selfCheckConfig())))
	if err != nil {
		return "", fmt.Errorf("health check client: %w", err)
	}
	defer conn.Close()
	hc := healthpb.NewHealthClient(conn)
	var last error
	for {
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		resp, err := hc.Check(cctx, &healthpb.HealthCheckRequest{Service: "temporal.api.workflowservice.v1.WorkflowService"})
		cancel()
		if err == nil && resp.GetStatus() == healthpb.HealthCheckResponse_SERVING {
			return "", nil
		}
		if err != nil {
			last = err
		} else {
			last = fmt.Errorf("status %v", resp.GetStatus())
		}
		select {
		case <-ctx.Done():
			return "", fmt.Errorf("frontend %s not serving: %v", addr, last)
		case reason := <-stopCh:
			return reason, nil
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func readCommands(in *bufio.Reader, table *authz, tlsp *memTLS, stopCh chan<- string) {
	for {
		line, err := readLine(in)
		if len(line) > 0 && !isBlank(line) {
			handleCommand(line, table, tlsp, stopCh)
		}
		if err != nil {
			if err == io.EOF {
				stopCh <- "eof"
			} else {
				stopCh <- "stdin: " + err.Error()
			}
			return
		}
	}
}

func isBlank(b []byte) bool {
	for _, c := range b {
		if c != ' ' && c != '\t' && c != '\r' && c != '\n' {
			return false
		}
	}
	return true
}

func handleCommand(line []byte, table *authz, tlsp *memTLS, stopCh chan<- string) {
	var cmd command
	if err := json.Unmarshal(line, &cmd); err != nil {
		emit(map[string]any{"event": "error", "error": "bad command line: " + err.Error()})
		return
	}
	if len(cmd.ID) == 0 {
		emit(map[string]any{"event": "error", "error": "command without id"})
		return
	}
	switch cmd.Op {
	case "ping":
		ack(cmd.ID, nil)
	case "authz":
		n := table.update(cmd.Nodes, cmd.Replace)
		ack(cmd.ID, map[string]any{"nodes": table.size(), "cancelledCalls": n})
	case "operators":
		if cmd.Operators == nil {
			ack(cmd.ID, map[string]any{"error": "operators command without an operators table"})
			return
		}
		n := table.setOperators(cmd.Operators)
		ack(cmd.ID, map[string]any{"operators": table.operatorCount(), "cancelledCalls": n})
	case "tls":
		if err := tlsp.setLeaves(cmd.FrontendCert, cmd.FrontendKey, cmd.InternodeCert, cmd.InternodeKey); err != nil {
			ack(cmd.ID, map[string]any{"error": err.Error()})
			return
		}
		ack(cmd.ID, nil)
	case "stop":
		ack(cmd.ID, nil)
		stopCh <- "stop"
	default:
		ack(cmd.ID, map[string]any{"error": fmt.Sprintf("unknown op %q", cmd.Op)})
	}
}
