package main

// `join`: N nodes through /join with one token, C at a time, each written to
// DIR/nodes.jsonl as soon as it is accepted.

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"
)

const nodesFile = "nodes.jsonl"

// nodeRecord is one line of nodes.jsonl.
type nodeRecord struct {
	NodeID  string   `json:"node_id"`
	KeyPEM  string   `json:"key_pem"`
	CertPEM string   `json:"cert_pem"`
	Edges   []string `json:"edges,omitempty"`
}

type joinRequest struct {
	Type     string            `json:"type"`
	CSR      string            `json:"csr"`
	Token    string            `json:"token"`
	Labels   map[string]string `json:"labels"`
	Hostname string            `json:"hostname"`
}

type candidate struct {
	keyPEM string
	csrPEM string
}

// newCandidate makes a P-256 key and a CSR for it, as the agent does (CN "node": the
// cluster names the node in the certificate it issues).
func newCandidate() (candidate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return candidate{}, err
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{
		Subject:            pkix.Name{CommonName: "node"},
		SignatureAlgorithm: x509.ECDSAWithSHA256,
	}, key)
	if err != nil {
		return candidate{}, err
	}
	pkcs8, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return candidate{}, err
	}
	return candidate{
		keyPEM: string(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: pkcs8})),
		csrPEM: string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der})),
	}, nil
}

func runJoin(args []string) error {
	fs := flag.NewFlagSet("join", flag.ContinueOnError)
	edge := fs.String("edge", "", "the edge to join through, HOST:PORT")
	caPath := fs.String("ca", "", "the cluster CA certificate (PEM)")
	n := fs.Int("nodes", 0, "how many nodes to join")
	concurrency := fs.Int("concurrency", 16, "joins in flight (the edge admits 64 unauthenticated connections per source address)")
	outDir := fs.String("out", "", "directory for nodes.jsonl (0600, appended)")
	prefix := fs.String("hostname-prefix", "loadgen-", "each node's hostname is PREFIX + its index")
	var labels listFlag
	fs.Var(&labels, "label", "KEY=VALUE, repeatable: the nodes' own labels")
	var from sources
	from.register(fs)
	if err := parse(fs, args); err != nil {
		return err
	}
	if *edge == "" || *caPath == "" || *outDir == "" {
		return usageError{"join needs --edge, --ca and --out"}
	}
	if err := checkEdge(*edge); err != nil {
		return err
	}
	if err := from.check(); err != nil {
		return err
	}
	if *n < 1 || *concurrency < 1 {
		return usageError{"--nodes and --concurrency must be at least 1"}
	}
	if err := from.checkCount(*n); err != nil {
		return err
	}
	labelMap := map[string]string{}
	for _, l := range labels {
		k, v, ok := strings.Cut(l, "=")
		if !ok || k == "" {
			return usageError{fmt.Sprintf("--label %q is not KEY=VALUE", l)}
		}
		labelMap[k] = v
	}
	token := os.Getenv("OZ0_JOIN_TOKEN")
	if token == "" {
		return usageError{"set OZ0_JOIN_TOKEN to the join token"}
	}
	roots, err := loadCA(*caPath)
	if err != nil {
		return usageError{err.Error()}
	}
	if err := os.MkdirAll(*outDir, 0o700); err != nil {
		return fmt.Errorf("cannot make --out: %w", err)
	}
	path := filepath.Join(*outDir, nodesFile)
	file, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return fmt.Errorf("cannot open %s: %w", path, err)
	}
	defer file.Close()
	// An existing file made by someone else may be more open: it holds keys.
	if err := file.Chmod(0o600); err != nil {
		return fmt.Errorf("cannot make %s private: %w", path, err)
	}

	// Keys and certificate requests before anything is timed: the edge is measured.
	began := time.Now()
	candidates := make([]candidate, *n)
	for i := range candidates {
		if candidates[i], err = newCandidate(); err != nil {
			return fmt.Errorf("cannot make a key: %w", err)
		}
	}
	keysSeconds := time.Since(began).Seconds()
	progress("%d keys and CSRs in %.2f s", *n, keysSeconds)

	cfg := tlsConfig(roots, nil)
	var (
		mu        sync.Mutex
		latencies []float64
		errs      = map[string]int{}
		next      int
		written   error
		done      int
	)
	report := max(1, *n/10)
	began = time.Now()
	var wg sync.WaitGroup
	for w := 0; w < min(*concurrency, *n); w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				mu.Lock()
				i := next
				next++
				mu.Unlock()
				if i >= *n {
					return
				}
				source := from.of(i)
				req := joinRequest{"join", candidates[i].csrPEM, token, labelMap, fmt.Sprintf("%s%d", *prefix, i)}
				t0 := time.Now()
				record, kind := joinOne(*edge, cfg, source, &req)
				latency := time.Since(t0).Seconds()
				mu.Lock()
				if kind != "" {
					errs[kind]++
				} else {
					record.KeyPEM = candidates[i].keyPEM
					line, _ := json.Marshal(record)
					if _, err := file.Write(append(line, '\n')); err != nil && written == nil {
						written = err
					}
					latencies = append(latencies, latency)
				}
				done++
				if done%report == 0 {
					progress("joins: %d/%d done, errors %v", done, *n, errs)
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	wall := time.Since(began).Seconds()
	if written != nil {
		return fmt.Errorf("cannot write %s: %w", path, written)
	}
	perSecond := 0.0
	if wall > 0 {
		perSecond = round1(float64(len(latencies)) / wall)
	}
	stdout.line(map[string]any{
		"attempted":         *n,
		"joined":            len(latencies),
		"concurrency":       *concurrency,
		"keys_and_csrs_s":   round2(keysSeconds),
		"wall_s":            round2(wall),
		"joins_per_s":       perSecond,
		"latency_ms":        percentiles(latencies),
		"errors":            errs,
		"nodes_file":        path,
		"generator_rss_mib": rssMiB(),
	})
	return nil
}

// joinOne asks the edge to join one node: its record, or the kind of failure.
func joinOne(edge string, cfg *tls.Config, source string, req *joinRequest) (nodeRecord, string) {
	ctx, cancel := context.WithTimeout(context.Background(), dialTimeout+handshakeTimeout+upgradeTimeout)
	defer cancel()
	c, err := open(ctx, edge, "/join", cfg, source)
	if err != nil {
		return nodeRecord{}, errorKind(err)
	}
	defer c.closeGracefully()
	hello, _, err := c.receive(helloTimeout)
	if err != nil {
		return nodeRecord{}, "hello:" + errorKind(err)
	}
	if hello.Type != "hello" {
		return nodeRecord{}, "hello:unexpected:" + hello.Type
	}
	if err := c.sendJSON(req); err != nil {
		return nodeRecord{}, "send:" + errorKind(err)
	}
	answer, _, err := c.receive(joinAnswerTimeout)
	if err != nil {
		return nodeRecord{}, "answer:" + errorKind(err)
	}
	switch {
	case answer.Type == "joined" && answer.State == "accepted" && answer.Cert != "":
		return nodeRecord{NodeID: answer.NodeID, CertPEM: answer.Cert, Edges: answer.Edges}, ""
	case answer.Type == "joined":
		return nodeRecord{}, "joined:" + answer.State
	case answer.Type == "error":
		return nodeRecord{}, "error:" + answer.Code
	}
	return nodeRecord{}, "unexpected:" + answer.Type
}
