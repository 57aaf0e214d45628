package main

// `posts`: many POSTs to the management API at once, each on a TCP connection of its own
// with a full TLS 1.3 handshake and the operator's client certificate, as that many
// separate CLI processes would send them, from a client that costs the machine little.
// With --keep every connection is opened and its handshake done first (not timed), then
// the requests are released together on them, as a client that keeps its connections.

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"
)

// post is one request to make: where to send it, parsed before anything is timed.
type post struct {
	raw     string // as given
	address string // HOST:PORT to connect to
	tls     *tls.Config
	request []byte // the whole HTTP/1.1 request
	warm    []byte // with --keep, the request that warms the connection up (GET /healthz)
}

// postResult is one output line.
type postResult struct {
	URL     string   `json:"url"`
	Status  int      `json:"status"`
	Start   float64  `json:"start"`
	TLSDone *float64 `json:"tls_done"`
	End     float64  `json:"end"`
	Error   string   `json:"error,omitempty"`
}

func runPosts(args []string) error {
	fs := flag.NewFlagSet("posts", flag.ContinueOnError)
	caPath := fs.String("ca", "", "the cluster CA certificate (PEM)")
	certPath := fs.String("cert", "", "the operator's client certificate (PEM)")
	keyPath := fs.String("key", "", "its private key (PEM: PKCS#8 or SEC1)")
	body := fs.String("body", "{}", "the JSON body of every request")
	var urls listFlag
	fs.Var(&urls, "url", "https URL to POST to, repeatable (one request each)")
	urlsFile := fs.String("urls-file", "", "file of URLs, one a line (blank lines ignored)")
	timeout := fs.Float64("timeout", 30, "seconds each request may take, connect to answer")
	source := fs.String("source", "", "local address to connect from")
	keep := fs.Bool("keep", false, "open every connection and finish its TLS handshake first (not timed), then release the requests on them")
	if err := parse(fs, args); err != nil {
		return err
	}
	if err := checkPosts(*caPath, *certPath, *keyPath, *body, urls, *urlsFile, *timeout, *source); err != nil {
		return err
	}
	if *urlsFile != "" {
		raw, err := os.ReadFile(*urlsFile)
		if err != nil {
			return usageError{fmt.Sprintf("cannot read --urls-file: %s", err)}
		}
		if urls = parseURLList(string(raw)); len(urls) == 0 {
			return usageError{fmt.Sprintf("--urls-file %s names no URL", *urlsFile)}
		}
	}
	// Everything parsed and built before the requests are released: only they are timed.
	posts, err := preparePosts(*caPath, *certPath, *keyPath, *body, urls, *keep)
	if err != nil {
		return err
	}
	var local net.Addr
	if *source != "" {
		local = &net.TCPAddr{IP: net.ParseIP(*source)}
	}
	deadline := time.Duration(*timeout * float64(time.Second))

	var (
		mu      sync.Mutex
		results []postResult
	)
	warm, spent := sendPosts(posts, local, deadline, *keep, func(r postResult) {
		stdout.line(r)
		mu.Lock()
		results = append(results, r)
		mu.Unlock()
	})

	var latencies, handshakes []float64
	ok := 0
	errs := map[string]int{}
	for _, r := range results {
		switch {
		case r.Error != "":
			kind, _, _ := strings.Cut(r.Error, " ")
			errs[kind]++
		case r.Status < 200 || r.Status > 299:
			errs["status:"+strconv.Itoa(r.Status)]++
		default:
			ok++
		}
		if r.Status != 0 {
			latencies = append(latencies, r.End-r.Start)
		}
		if r.TLSDone != nil {
			handshakes = append(handshakes, *r.TLSDone-r.Start)
		}
	}
	summary := map[string]any{
		"summary":    true,
		"keep":       *keep,
		"requests":   len(results),
		"ok":         ok,
		"errors":     errs,
		"latency_ms": percentiles(latencies),
		"tls_ms":     percentiles(handshakes),
		"warm_s":     nil,
		"cpu_s":      round4(spent),
	}
	if *keep {
		// The handshakes were done before the release: not measured.
		summary["tls_ms"] = nil
		summary["warm_s"] = round4(warm)
	}
	stdout.line(summary)
	return nil
}

// sendPosts releases every request of POSTS together, from LOCAL, each within TIMEOUT,
// and calls REPORT (from any goroutine) with each one's line as it ends. With KEEP, every
// connection is first opened and its handshake done, all by one deadline TIMEOUT away (a
// connection that fails is reported then); the requests are released once all are ready.
// The warm-up's seconds (0 without KEEP), and this process's CPU seconds from the release
// to the last answer.
func sendPosts(posts []post, local net.Addr, timeout time.Duration, keep bool, report func(postResult)) (warm, cpu float64) {
	var ready, done sync.WaitGroup
	warmStart := monotonic()
	warmCtx, warmCancel := context.WithTimeout(context.Background(), timeout)
	defer warmCancel()
	release := make(chan struct{})
	for _, p := range posts {
		ready.Add(1)
		done.Add(1)
		go func() {
			defer done.Done()
			var conn *tls.Conn
			if keep {
				var failed *postResult
				if conn, failed = warmUp(warmCtx, p, local); failed != nil {
					report(*failed) // nothing to release
					ready.Done()
					return
				}
				defer conn.Close()
			}
			ready.Done()
			<-release
			if conn != nil {
				report(postOn(conn, p, timeout))
			} else {
				report(postOnce(p, local, timeout))
			}
		}()
	}
	ready.Wait()
	if keep {
		warm = monotonic() - warmStart
	}
	began := cpuSeconds()
	close(release)
	done.Wait()
	return warm, cpuSeconds() - began
}

// preparePosts loads the CA, the client certificate and its key, and makes each URL's
// request (KEEP: without `Connection: close`) and TLS configuration (one per host name).
func preparePosts(caPath, certPath, keyPath, body string, urls []string, keep bool) ([]post, error) {
	roots, err := loadCA(caPath)
	if err != nil {
		return nil, usageError{err.Error()}
	}
	// tls.X509KeyPair reads "PRIVATE KEY" (PKCS#8) and "EC PRIVATE KEY" (SEC1) blocks.
	cert, err := tls.LoadX509KeyPair(certPath, keyPath)
	if err != nil {
		return nil, usageError{fmt.Sprintf("cannot load --cert and --key: %s", err)}
	}
	configs := map[string]*tls.Config{}
	posts := make([]post, len(urls))
	for i, raw := range urls {
		u, err := checkURL(raw)
		if err != nil {
			return nil, err
		}
		cfg := configs[u.Hostname()]
		if cfg == nil {
			cfg = postsTLSConfig(roots, &cert, u.Hostname())
			configs[u.Hostname()] = cfg
		}
		posts[i] = post{raw, hostPort(u), cfg, httpRequest(u, body, !keep), warmRequest(u)}
	}
	return posts, nil
}

func checkPosts(ca, cert, key, body string, urls []string, urlsFile string, timeout float64, source string) error {
	if ca == "" || cert == "" || key == "" {
		return usageError{"posts needs --ca, --cert and --key"}
	}
	if len(urls) > 0 && urlsFile != "" {
		return usageError{"give --url or --urls-file, not both"}
	}
	if len(urls) == 0 && urlsFile == "" {
		return usageError{"posts needs --url (repeatable) or --urls-file"}
	}
	for _, u := range urls {
		if _, err := checkURL(u); err != nil {
			return err
		}
	}
	if !json.Valid([]byte(body)) {
		return usageError{fmt.Sprintf("--body %q is not JSON", body)}
	}
	if timeout <= 0 {
		return usageError{"--timeout must be more than 0 seconds"}
	}
	if source != "" && net.ParseIP(source) == nil {
		return usageError{fmt.Sprintf("--source %q is not an IP address", source)}
	}
	return nil
}

// parseURLList reads a --urls-file: one URL a line, surrounding spaces and blank lines
// ignored.
func parseURLList(text string) []string {
	var urls []string
	for line := range strings.Lines(text) {
		if line = strings.TrimSpace(line); line != "" {
			urls = append(urls, line)
		}
	}
	return urls
}

// checkURL accepts https://HOST[:PORT]/PATH[?QUERY] only.
func checkURL(raw string) (*url.URL, error) {
	u, err := url.Parse(raw)
	if err != nil || u.Scheme != "https" || u.Hostname() == "" || u.User != nil || u.Fragment != "" {
		return nil, usageError{fmt.Sprintf("--url %q is not https://HOST[:PORT]/PATH", raw)}
	}
	if port := u.Port(); port != "" {
		if p, err := strconv.Atoi(port); err != nil || p < 1 || p > 65535 {
			return nil, usageError{fmt.Sprintf("--url %q: bad port", raw)}
		}
	}
	return u, nil
}

func hostPort(u *url.URL) string {
	port := u.Port()
	if port == "" {
		port = "443"
	}
	return net.JoinHostPort(u.Hostname(), port)
}

// httpRequest is the whole request for U, written by hand: one write; with ASKCLOSE it asks
// for no keep-alive (`Connection: close`), without it is what a kept connection sends.
func httpRequest(u *url.URL, body string, askClose bool) []byte {
	var b strings.Builder
	fmt.Fprintf(&b, "POST %s HTTP/1.1\r\nHost: %s\r\n", u.RequestURI(), u.Host)
	fmt.Fprintf(&b, "Content-Type: application/json\r\nContent-Length: %d\r\n", len(body))
	if askClose {
		b.WriteString("Connection: close\r\n")
	}
	b.WriteString("User-Agent: oz0-loadgen\r\n\r\n")
	b.WriteString(body)
	return []byte(b.String())
}

// warmRequest is what --keep sends on a connection before the release: a request the
// server answers without its database, so that the connection is one a client has kept
// (its TLS handshake done on both sides: in TLS 1.3 the client is done before the server
// has checked its certificate) and costs the measured requests nothing.
func warmRequest(u *url.URL) []byte {
	return []byte(fmt.Sprintf("GET /healthz HTTP/1.1\r\nHost: %s\r\nUser-Agent: oz0-loadgen\r\n\r\n", u.Host))
}

// postsTLSConfig: TLS 1.3 only, the server's certificate verified against ROOTS for
// SERVERNAME (an IP address is checked against the certificate's IP SANs), CERT always
// offered, and never a resumed session: every connection is a full handshake. One key
// share, X25519, as curl with OpenSSL 3.0 offers and our server chooses (Go would add an
// ML-KEM one the server cannot use). A chain is verified once per distinct server
// certificate (every handshake still checks the server's signature with its key): the
// client's CPU is what a benchmark wants small.
func postsTLSConfig(roots *x509.CertPool, cert *tls.Certificate, serverName string) *tls.Config {
	var (
		mu       sync.Mutex
		verified = map[string]bool{}
	)
	return &tls.Config{
		MinVersion:             tls.VersionTLS13,
		MaxVersion:             tls.VersionTLS13,
		CurvePreferences:       []tls.CurveID{tls.X25519},
		ClientSessionCache:     nil,
		SessionTicketsDisabled: true,
		// The server name our clients send on 8443: the server answers it with its
		// cluster-CA certificate, any other (or none) with the web UI's (oz0/server/tls.py).
		ServerName: "api.oz0.invalid",
		// Verified below, with the host name, once per certificate.
		InsecureSkipVerify: true,
		VerifyConnection: func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) == 0 {
				return errors.New("the server sent no certificate")
			}
			leaf := cs.PeerCertificates[0]
			// Held while verifying: the handshakes released together wait for the first
			// one's verification instead of all repeating it.
			mu.Lock()
			defer mu.Unlock()
			if verified[string(leaf.Raw)] {
				return nil
			}
			intermediates := x509.NewCertPool()
			for _, c := range cs.PeerCertificates[1:] {
				intermediates.AddCert(c)
			}
			_, err := leaf.Verify(x509.VerifyOptions{
				Roots:         roots,
				Intermediates: intermediates,
				DNSName:       serverName,
				KeyUsages:     []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
			})
			if err == nil {
				verified[string(leaf.Raw)] = true
			}
			return err
		},
		// Whatever CA names the server's request lists.
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			return cert, nil
		},
	}
}

// postOnce sends P on a new connection from LOCAL (nil: the kernel's choice) and reads
// the whole answer, all within TIMEOUT.
func postOnce(p post, local net.Addr, timeout time.Duration) postResult {
	r := postResult{URL: p.raw, Start: monotonic()}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	tc, err := dialTLS(ctx, p, local)
	if err != nil {
		return r.failed(err)
	}
	defer tc.Close()
	at := monotonic()
	r.TLSDone = &at
	return exchange(tc, p, r, false)
}

// warmUp opens P's connection from LOCAL, finishes its TLS handshake and has a first
// request (warmRequest) answered on it by CTX's deadline, for --keep; if it cannot, the failed request's line (from this call's start).
func warmUp(ctx context.Context, p post, local net.Addr) (*tls.Conn, *postResult) {
	r := postResult{URL: p.raw, Start: monotonic()}
	tc, err := dialTLS(ctx, p, local)
	if err != nil {
		r = r.failed(err)
		return nil, &r
	}
	warmed := exchange(tc, post{raw: p.raw, request: p.warm}, r, true)
	if warmed.Status < 200 || warmed.Status > 299 {
		_ = tc.Close()
		if warmed.Error == "" {
			warmed = warmed.failed(&stageError{"warm", fmt.Errorf("GET /healthz answered %d", warmed.Status)})
		}
		return nil, &warmed
	}
	return tc, nil
}

// postOn sends P on TC, a connection warmUp made, and reads the answer by its length, all
// within TIMEOUT from now: the request's start. The handshake was done by then.
func postOn(tc *tls.Conn, p post, timeout time.Duration) postResult {
	start := monotonic()
	r := postResult{URL: p.raw, Start: start, TLSDone: &start}
	_ = tc.SetDeadline(time.Now().Add(timeout))
	return exchange(tc, p, r, true)
}

// dialTLS connects to P's address from LOCAL and does the TLS handshake, by CTX's
// deadline, which also bounds the connection's later reads and writes.
func dialTLS(ctx context.Context, p post, local net.Addr) (*tls.Conn, error) {
	d := net.Dialer{LocalAddr: local}
	raw, err := d.DialContext(ctx, "tcp", p.address)
	if err != nil {
		return nil, &stageError{"connect", err}
	}
	if dl, ok := ctx.Deadline(); ok {
		_ = raw.SetDeadline(dl)
	}
	tc := tls.Client(raw, p.tls)
	if err := tc.HandshakeContext(ctx); err != nil {
		_ = raw.Close()
		return nil, &stageError{"tls", err}
	}
	return tc, nil
}

// exchange writes P's request on TC and reads the whole answer, completing R. On a KEPT
// connection (no `Connection: close` asked) the answer must say its length (Content-Length
// or chunks): the connection is not read to its end.
func exchange(tc *tls.Conn, p post, r postResult, kept bool) postResult {
	if _, err := tc.Write(p.request); err != nil {
		return r.failed(&stageError{"send", err})
	}
	resp, err := http.ReadResponse(bufio.NewReaderSize(tc, 4096), nil)
	if err != nil {
		return r.failed(&stageError{"answer", err})
	}
	if kept && resp.ContentLength < 0 && len(resp.TransferEncoding) == 0 {
		// Nothing would end its body but the server's idle timer.
		_ = resp.Body.Close()
		return r.failed(&stageError{"answer", errors.New("a kept connection's answer without a length")})
	}
	_, err = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	if err != nil {
		return r.failed(&stageError{"answer", err})
	}
	r.Status = resp.StatusCode
	r.End = monotonic()
	return r
}

// failed is R ended now by ERR (a *stageError).
func (r postResult) failed(err error) postResult {
	r.End = monotonic()
	r.Status = 0
	cause := err
	var se *stageError
	if errors.As(err, &se) {
		cause = se.err
	}
	r.Error = errorKind(err) + " " + cause.Error()
	return r
}

func round4(v float64) float64 { return float64(int64(v*10000+0.5)) / 10000 }
