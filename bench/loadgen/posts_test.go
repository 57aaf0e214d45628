package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"log"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestURLListSkipsBlankLinesAndSpaces(t *testing.T) {
	text := "https://127.0.0.1:8443/a\n\n  https://127.0.0.1:8443/b  \r\n\t\nhttps://h/c"
	got := parseURLList(text)
	want := []string{"https://127.0.0.1:8443/a", "https://127.0.0.1:8443/b", "https://h/c"}
	if !slices.Equal(got, want) {
		t.Fatalf("parsed %q, want %q", got, want)
	}
	if got := parseURLList("\n \n"); len(got) != 0 {
		t.Fatalf("a blank file names %q", got)
	}
}

func TestURLsMustBeHTTPS(t *testing.T) {
	for _, bad := range []string{
		"http://127.0.0.1:8443/a", "https:///a", "127.0.0.1:8443/a", "https://u@h/a",
		"https://h:0/a", "https://h:99999/a", "https://h/a#f", "",
	} {
		if _, err := checkURL(bad); !isUsageError(err) {
			t.Errorf("--url %q accepted (%v)", bad, err)
		}
	}
	u, err := checkURL("https://127.0.0.1:8443/api/v1/nodes/n/block?x=1")
	if err != nil {
		t.Fatal(err)
	}
	if hostPort(u) != "127.0.0.1:8443" || u.Hostname() != "127.0.0.1" {
		t.Fatalf("connects to %s for %s", hostPort(u), u.Hostname())
	}
	u, _ = checkURL("https://[::1]/a")
	if hostPort(u) != "[::1]:443" {
		t.Fatalf("default port: %s", hostPort(u))
	}
}

func TestRequestIsOneHTTP11PostThatClosesTheConnection(t *testing.T) {
	u, _ := checkURL("https://127.0.0.1:8443/api/v1/nodes/n/block?x=1")
	got := string(httpRequest(u, `{"reason": "r"}`, true))
	want := "POST /api/v1/nodes/n/block?x=1 HTTP/1.1\r\nHost: 127.0.0.1:8443\r\n" +
		"Content-Type: application/json\r\nContent-Length: 15\r\n" +
		"Connection: close\r\nUser-Agent: oz0-loadgen\r\n\r\n{\"reason\": \"r\"}"
	if got != want {
		t.Fatalf("request\n%q\nwant\n%q", got, want)
	}
	// --keep: the same without asking the server to close.
	got = string(httpRequest(u, `{"reason": "r"}`, false))
	if want = strings.Replace(want, "Connection: close\r\n", "", 1); got != want {
		t.Fatalf("kept request\n%q\nwant\n%q", got, want)
	}
}

func TestPostsFlagsAreChecked(t *testing.T) {
	url := []string{"https://127.0.0.1:8443/a"}
	cases := []struct {
		name                string
		ca, cert, key, body string
		urls                []string
		file                string
		timeout             float64
		source              string
		want                string // in the error; "" for none
	}{
		{"fine", "ca", "c", "k", "{}", url, "", 30, "", ""},
		{"fine with a file and a source", "ca", "c", "k", `{"a": 1}`, nil, "f", 1, "127.0.0.2", ""},
		{"no key", "ca", "c", "", "{}", url, "", 30, "", "--key"},
		{"no URL", "ca", "c", "k", "{}", nil, "", 30, "", "--url"},
		{"both", "ca", "c", "k", "{}", url, "f", 30, "", "not both"},
		{"bad URL", "ca", "c", "k", "{}", []string{"http://h/a"}, "", 30, "", "https"},
		{"bad body", "ca", "c", "k", "{", url, "", 30, "", "not JSON"},
		{"no time", "ca", "c", "k", "{}", url, "", 0, "", "--timeout"},
		{"bad source", "ca", "c", "k", "{}", url, "", 30, "here", "--source"},
	}
	for _, c := range cases {
		err := checkPosts(c.ca, c.cert, c.key, c.body, c.urls, c.file, c.timeout, c.source)
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%s: %v", c.name, err)
		case c.want != "" && (!isUsageError(err) || !strings.Contains(err.Error(), c.want)):
			t.Errorf("%s: error %v, want a usage error naming %q", c.name, err, c.want)
		}
	}
}

func isUsageError(err error) bool {
	var ue usageError
	return errors.As(err, &ue)
}

// testPKI writes a CA, and a client certificate with its key in both PEM forms, into DIR;
// the server's certificate for 127.0.0.1 (an IP SAN only, as our servers' are).
type testPKI struct {
	ca, cert, pkcs8, sec1 string
	server                tls.Certificate
	clients               *x509.CertPool
}

func newTestPKI(t *testing.T) testPKI {
	t.Helper()
	dir := t.TempDir()
	key := func() *ecdsa.PrivateKey {
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	caKey := key()
	caTemplate := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "test CA"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTemplate, caTemplate, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	caCert, _ := x509.ParseCertificate(caDER)
	issue := func(serial int64, usage x509.ExtKeyUsage, ip string) ([]byte, *ecdsa.PrivateKey) {
		k := key()
		template := &x509.Certificate{
			SerialNumber: big.NewInt(serial),
			Subject:      pkix.Name{CommonName: "leaf"},
			NotBefore:    time.Now().Add(-time.Hour),
			NotAfter:     time.Now().Add(time.Hour),
			KeyUsage:     x509.KeyUsageDigitalSignature,
			ExtKeyUsage:  []x509.ExtKeyUsage{usage},
		}
		if ip != "" {
			template.IPAddresses = []net.IP{net.ParseIP(ip)}
		}
		der, err := x509.CreateCertificate(rand.Reader, template, caCert, &k.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		return der, k
	}
	write := func(name, kind string, der []byte) string {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: der}), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	p := testPKI{clients: x509.NewCertPool()}
	p.clients.AddCert(caCert)
	p.ca = write("ca.crt", "CERTIFICATE", caDER)
	serverDER, serverKey := issue(2, x509.ExtKeyUsageServerAuth, "127.0.0.1")
	p.server = tls.Certificate{Certificate: [][]byte{serverDER}, PrivateKey: serverKey}
	clientDER, clientKey := issue(3, x509.ExtKeyUsageClientAuth, "")
	p.cert = write("operator.crt", "CERTIFICATE", clientDER)
	pkcs8, _ := x509.MarshalPKCS8PrivateKey(clientKey)
	p.pkcs8 = write("operator.key", "PRIVATE KEY", pkcs8)
	sec1, _ := x509.MarshalECPrivateKey(clientKey)
	p.sec1 = write("operator-sec1.key", "EC PRIVATE KEY", sec1)
	return p
}

func TestPostsAreFullHandshakesWithTheClientCertificate(t *testing.T) {
	pki := newTestPKI(t)
	var (
		mu    sync.Mutex
		seen  []string
		fresh = true
	)
	server := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		mu.Lock()
		seen = append(seen, r.Method+" "+r.URL.Path+" "+string(body))
		fresh = fresh && !r.TLS.DidResume && r.TLS.Version == tls.VersionTLS13 &&
			len(r.TLS.PeerCertificates) == 1
		mu.Unlock()
		w.WriteHeader(http.StatusAccepted)
	}))
	server.Config.ErrorLog = log.New(io.Discard, "", 0) // the refused handshake below
	server.TLS = &tls.Config{
		Certificates: []tls.Certificate{pki.server},
		ClientAuth:   tls.RequireAndVerifyClientCert,
		ClientCAs:    pki.clients,
	}
	server.StartTLS()
	defer server.Close()
	port := server.Listener.Addr().(*net.TCPAddr).Port
	url := fmt.Sprintf("https://127.0.0.1:%d/api/v1/nodes/n/block", port)

	for _, key := range []string{pki.pkcs8, pki.sec1} {
		posts, err := preparePosts(pki.ca, pki.cert, key, `{"reason": "r"}`, []string{url, url}, false)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range posts {
			r := postOnce(p, nil, 5*time.Second)
			if r.Status != http.StatusAccepted || r.Error != "" || r.TLSDone == nil ||
				!(r.Start <= *r.TLSDone && *r.TLSDone <= r.End) {
				t.Fatalf("with %s: %+v", filepath.Base(key), r)
			}
		}
	}
	if len(seen) != 4 || seen[0] != `POST /api/v1/nodes/n/block {"reason": "r"}` || !fresh {
		t.Fatalf("the server saw %q (all full TLS 1.3 handshakes with a client certificate: %v)", seen, fresh)
	}

	// Another host name than the certificate's IP address: refused.
	other := fmt.Sprintf("https://localhost:%d/a", port)
	posts, err := preparePosts(pki.ca, pki.cert, pki.pkcs8, "{}", []string{other}, false)
	if err != nil {
		t.Fatal(err)
	}
	if r := postOnce(posts[0], nil, 5*time.Second); r.Status != 0 || !strings.HasPrefix(r.Error, "tls:certificate ") {
		t.Fatalf("a server certificate without that name: %+v", r)
	}
	// Nothing listening: a connect error, no handshake.
	server.Close()
	if r := postOnce(posts[0], nil, 5*time.Second); r.Status != 0 || r.TLSDone != nil || !strings.HasPrefix(r.Error, "connect:") {
		t.Fatalf("nothing listening: %+v", r)
	}
}

// With --keep every connection's handshake is done before any request is sent; then each
// connection carries exactly one request, kept alive on the wire, and the client closes it.
func TestKeptPostsAreReleasedOnWarmConnections(t *testing.T) {
	pki := newTestPKI(t)
	const n = 8
	var (
		mu         sync.Mutex
		handshakes []float64          // CLOCK_MONOTONIC, as each ClientHello arrived
		requests   []float64          // as each POST arrived
		warms      []float64          // as each warm-up GET /healthz arrived
		perConn    = map[string]int{} // requests by the client's address
		idle       = map[string]bool{}
		closed     = map[string]bool{}
		asked      []bool // the requests' Connection: close
	)
	server := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body)
		mu.Lock()
		if r.Method == http.MethodGet && r.URL.Path == "/healthz" {
			warms = append(warms, monotonic())
		} else {
			requests = append(requests, monotonic())
		}
		perConn[r.RemoteAddr]++
		asked = append(asked, r.Close)
		mu.Unlock()
		w.WriteHeader(http.StatusAccepted)
	}))
	server.Config.ConnState = func(c net.Conn, state http.ConnState) {
		mu.Lock()
		defer mu.Unlock()
		switch state {
		case http.StateIdle: // answered, kept for another request
			idle[c.RemoteAddr().String()] = true
		case http.StateClosed:
			closed[c.RemoteAddr().String()] = true
		}
	}
	base := &tls.Config{
		Certificates: []tls.Certificate{pki.server},
		ClientAuth:   tls.RequireAndVerifyClientCert,
		ClientCAs:    pki.clients,
	}
	server.TLS = &tls.Config{
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			mu.Lock()
			handshakes = append(handshakes, monotonic())
			mu.Unlock()
			return base, nil
		},
	}
	server.StartTLS()
	defer server.Close()
	port := server.Listener.Addr().(*net.TCPAddr).Port
	// And one URL where nothing listens: its connection fails in the warm-up, the rest go on.
	nothing, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	refused := fmt.Sprintf("https://%s/a", nothing.Addr())
	_ = nothing.Close()

	urls := []string{refused}
	for i := range n {
		urls = append(urls, fmt.Sprintf("https://127.0.0.1:%d/api/v1/nodes/n%d/block", port, i))
	}
	posts, err := preparePosts(pki.ca, pki.cert, pki.pkcs8, "{}", urls, true)
	if err != nil {
		t.Fatal(err)
	}
	var results []postResult
	warm, _ := sendPosts(posts, nil, 5*time.Second, true, func(r postResult) {
		mu.Lock()
		results = append(results, r)
		mu.Unlock()
	})

	mu.Lock()
	defer mu.Unlock()
	if len(results) != n+1 || warm <= 0 {
		t.Fatalf("%d results after %.3f s of warm-up: %+v", len(results), warm, results)
	}
	if r := results[0]; r.URL != refused || r.Status != 0 || r.TLSDone != nil ||
		!strings.HasPrefix(r.Error, "connect:ECONNREFUSED ") {
		t.Fatalf("the connection that could not be opened, first: %+v", r)
	}
	released := results[1].Start
	for _, r := range results[1:] {
		if r.Status != http.StatusAccepted || r.Error != "" || r.TLSDone == nil ||
			*r.TLSDone != r.Start || r.End < r.Start {
			t.Fatalf("a kept request: %+v", r)
		}
		released = min(released, r.Start)
	}
	if len(handshakes) != n || len(warms) != n || len(requests) != n || len(perConn) != n {
		t.Fatalf("%d handshakes, %d warm-ups and %d requests on %d connections; want %d of each",
			len(handshakes), len(warms), len(requests), len(perConn), n)
	}
	for addr, count := range perConn {
		if count != 2 {
			t.Fatalf("connection %s carried %d requests, not its warm-up and its POST", addr, count)
		}
	}
	if slices.Contains(asked, true) {
		t.Fatalf("a kept request asked for Connection: close (%v)", asked)
	}
	// Every handshake and warm-up before the first request's release; every POST after it.
	last := max(slices.Max(handshakes), slices.Max(warms))
	if last > released || slices.Min(requests) < released {
		t.Fatalf("last handshake or warm-up at %.6f, release at %.6f, first request at %.6f",
			last, released, slices.Min(requests))
	}
	// The server kept each connection after its answer, and then saw the client close it.
	deadline := time.Now().Add(5 * time.Second)
	for len(closed) < n && time.Now().Before(deadline) {
		mu.Unlock()
		time.Sleep(10 * time.Millisecond)
		mu.Lock()
	}
	for addr := range perConn {
		if !idle[addr] || !closed[addr] {
			t.Fatalf("connection %s: kept alive %v, closed %v", addr, idle[addr], closed[addr])
		}
	}
}
