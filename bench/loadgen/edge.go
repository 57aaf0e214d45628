package main

// Talking to an edge (docs/node-protocol.md): TCP, TLS verified against the cluster CA
// (no host name check: a node trusts any server certificate of its pinned CA, whatever
// address reached it), the websocket upgrade, and one JSON object per text frame.

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"sync"
	"syscall"
	"time"

	"github.com/gorilla/websocket"
	"golang.org/x/sys/unix"
)

// Bounds on every network wait; the edge's own (docs/node-protocol.md) are 10 s each.
const (
	dialTimeout      = 10 * time.Second
	handshakeTimeout = 10 * time.Second
	upgradeTimeout   = 10 * time.Second
	helloTimeout     = 10 * time.Second
	sendTimeout      = 10 * time.Second
	closeTimeout     = 5 * time.Second
	// A whole /join conversation on the edge is bounded by 50 s.
	joinAnswerTimeout = 50 * time.Second
	// Larger messages end the stream on the edge's side too.
	maxMessage = 64 * 1024
)

// The edge's heartbeat, byte for byte as Python's json.dumps writes it.
var edgeHeartbeat = []byte(`{"type": "heartbeat"}`)

// One pool of write buffers for every connection: an idle stream holds none.
var writeBuffers sync.Pool

func loadCA(path string) (*x509.CertPool, error) {
	pem, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("cannot read the CA file: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("%s holds no PEM certificate", path)
	}
	return pool, nil
}

// tlsConfig verifies the edge's certificate chain against ROOTS, as Python's
// ssl.create_default_context(cadata=...) with check_hostname off does, and presents
// CERT (if any) as client certificate.
func tlsConfig(roots *x509.CertPool, cert *tls.Certificate) *tls.Config {
	cfg := &tls.Config{
		MinVersion: tls.VersionTLS12,
		// Verified below, without a host name.
		InsecureSkipVerify: true,
		VerifyConnection: func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) == 0 {
				return errors.New("the edge sent no certificate")
			}
			intermediates := x509.NewCertPool()
			for _, c := range cs.PeerCertificates[1:] {
				intermediates.AddCert(c)
			}
			_, err := cs.PeerCertificates[0].Verify(x509.VerifyOptions{
				Roots:         roots,
				Intermediates: intermediates,
				KeyUsages:     []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
			})
			return err
		},
	}
	if cert != nil {
		// Always offered, whatever CA names the edge's request lists.
		cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			return cert, nil
		}
	}
	return cfg
}

// conn is one websocket to an edge, written by one goroutine at a time.
type conn struct {
	ws      *websocket.Conn
	writing sync.Mutex
}

// stageError says where connecting failed, for the error counts.
type stageError struct {
	stage string
	err   error
}

func (e *stageError) Error() string { return e.stage + ": " + e.err.Error() }
func (e *stageError) Unwrap() error { return e.err }

// open connects to EDGE's PATH from SOURCE (a local address, or "" for the kernel's
// choice), each step within its bound.
func open(ctx context.Context, edge, path string, cfg *tls.Config, source string) (*conn, error) {
	dialer := websocket.Dialer{
		HandshakeTimeout: upgradeTimeout,
		ReadBufferSize:   1024,
		WriteBufferSize:  1024,
		WriteBufferPool:  &writeBuffers,
		NetDialTLSContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			d := net.Dialer{Timeout: dialTimeout}
			if source != "" {
				d.LocalAddr = &net.TCPAddr{IP: net.ParseIP(source)}
			}
			raw, err := d.DialContext(ctx, network, addr)
			if err != nil {
				return nil, &stageError{"connect", err}
			}
			tc := tls.Client(raw, cfg)
			hctx, cancel := context.WithTimeout(ctx, handshakeTimeout)
			defer cancel()
			if err := tc.HandshakeContext(hctx); err != nil {
				_ = raw.Close()
				return nil, &stageError{"tls", err}
			}
			return tc, nil
		},
	}
	u := url.URL{Scheme: "wss", Host: edge, Path: path}
	ws, resp, err := dialer.DialContext(ctx, u.String(), nil)
	if resp != nil && resp.Body != nil {
		_ = resp.Body.Close()
	}
	if err != nil {
		var se *stageError
		if errors.As(err, &se) {
			return nil, se
		}
		return nil, &stageError{"upgrade", err}
	}
	ws.SetReadLimit(maxMessage)
	return &conn{ws: ws}, nil
}

// message is what the edge sends, as far as a load generator needs to know it.
type message struct {
	Type      string   `json:"type"`
	Code      string   `json:"code"`
	Message   string   `json:"message"`
	NodeID    string   `json:"node_id"`
	Server    string   `json:"server"`
	Heartbeat float64  `json:"heartbeat"`
	Edges     []string `json:"edges"`
	State     string   `json:"state"`
	Cert      string   `json:"certificate"`
	Challenge string   `json:"challenge"`
}

// receive reads one message within TIMEOUT (none if 0: the deadline set before holds).
func (c *conn) receive(timeout time.Duration) (message, []byte, error) {
	if timeout > 0 {
		_ = c.ws.SetReadDeadline(time.Now().Add(timeout))
	}
	var m message
	kind, raw, err := c.ws.ReadMessage()
	if err != nil {
		return m, nil, err
	}
	if kind != websocket.TextMessage {
		return m, raw, nil
	}
	if bytes.Equal(raw, edgeHeartbeat) {
		m.Type = "heartbeat" // most of what an idle stream hears: not worth a JSON parse
		return m, raw, nil
	}
	// Not a JSON object: ignored on a control stream, as the agent does.
	_ = json.Unmarshal(raw, &m)
	return m, raw, nil
}

func (c *conn) send(raw []byte) error {
	c.writing.Lock()
	defer c.writing.Unlock()
	_ = c.ws.SetWriteDeadline(time.Now().Add(sendTimeout))
	return c.ws.WriteMessage(websocket.TextMessage, raw)
}

func (c *conn) sendJSON(v any) error {
	raw, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return c.send(raw)
}

// closeFrame sends a normal close frame; the read loop then waits for the edge's answer.
func (c *conn) closeFrame() error {
	c.writing.Lock()
	defer c.writing.Unlock()
	frame := websocket.FormatCloseMessage(websocket.CloseNormalClosure, "")
	return c.ws.WriteControl(websocket.CloseMessage, frame, time.Now().Add(closeTimeout))
}

// closeGracefully closes with a close frame and waits at most closeTimeout for the edge's.
func (c *conn) closeGracefully() {
	if c.closeFrame() == nil {
		_ = c.ws.SetReadDeadline(time.Now().Add(closeTimeout))
		for {
			if _, _, err := c.ws.NextReader(); err != nil {
				break
			}
		}
	}
	_ = c.ws.Close()
}

// errorKind names an error briefly for counts: the stage and what failed.
func errorKind(err error) string {
	var se *stageError
	stage := ""
	if errors.As(err, &se) {
		stage = se.stage + ":"
		err = se.err
	}
	var ne net.Error
	var ce *websocket.CloseError
	var ve x509.UnknownAuthorityError
	var he x509.HostnameError
	var ie x509.CertificateInvalidError
	switch {
	case errors.As(err, &ce):
		return fmt.Sprintf("%sclose:%d", stage, ce.Code)
	case errors.As(err, &ve), errors.As(err, &he), errors.As(err, &ie):
		return stage + "certificate"
	case errors.Is(err, context.DeadlineExceeded), errors.As(err, &ne) && ne.Timeout():
		return stage + "timeout"
	case errors.Is(err, websocket.ErrBadHandshake):
		return stage + "bad_handshake"
	case errors.Is(err, net.ErrClosed):
		return stage + "closed"
	}
	var errno syscall.Errno
	switch {
	case errors.As(err, &errno):
		if name := unix.ErrnoName(errno); name != "" {
			return stage + name
		}
		return fmt.Sprintf("%serrno%d", stage, int(errno))
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return stage + "eof"
	}
	var re tls.RecordHeaderError
	var ae tls.AlertError
	if errors.As(err, &re) || errors.As(err, &ae) {
		return stage + "tls_alert"
	}
	return stage + "other"
}
