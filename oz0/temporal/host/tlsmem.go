package main

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"go.temporal.io/server/common/rpc/encryption"
)

// memTLS is an encryption.TLSConfigProvider built from PEM strings held in memory.
// Leaf certificates can be swapped at run time (daily renewal) through setLeaves;
// the CA pools are fixed for the life of the process.
type memTLS struct {
	clusterPool   *x509.CertPool
	internodePool *x509.CertPool
	frontend      atomic.Pointer[tls.Certificate]
	internode     atomic.Pointer[tls.Certificate]

	frontendServer  *tls.Config
	frontendClient  *tls.Config
	internodeServer *tls.Config
	internodeClient *tls.Config
}

var _ encryption.TLSConfigProvider = (*memTLS)(nil)

func poolFromPEM(what, pemText string) (*x509.CertPool, error) {
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM([]byte(pemText)) {
		return nil, fmt.Errorf("tls.%s: no PEM certificate found", what)
	}
	return pool, nil
}

func keyPair(what, certPEM, keyPEM string) (*tls.Certificate, error) {
	kp, err := tls.X509KeyPair([]byte(certPEM), []byte(keyPEM))
	if err != nil {
		return nil, fmt.Errorf("tls.%s: %w", what, err)
	}
	return &kp, nil
}

func newMemTLS(p TLSPEMs) (*memTLS, error) {
	m := &memTLS{}
	var err error
	if m.clusterPool, err = poolFromPEM("clusterCA", p.ClusterCA); err != nil {
		return nil, err
	}
	if m.internodePool, err = poolFromPEM("internodeCA", p.InternodeCA); err != nil {
		return nil, err
	}
	if err := m.setLeaves(p.FrontendCert, p.FrontendKey, p.InternodeCert, p.InternodeKey); err != nil {
		return nil, err
	}

	getFrontend := func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return m.frontend.Load(), nil }
	getInternode := func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return m.internode.Load(), nil }

	// Public frontend (7233): only clients holding a certificate from the cluster CA.
	m.frontendServer = &tls.Config{
		MinVersion:     tls.VersionTLS12,
		GetCertificate: getFrontend,
		ClientAuth:     tls.RequireAndVerifyClientCert,
		ClientCAs:      m.clusterPool,
	}
	// Used by Temporal only for calls to the public frontend (not used in our topology,
	// where the system worker goes through internal-frontend); kept valid anyway.
	m.frontendClient = &tls.Config{
		MinVersion: tls.VersionTLS12,
		RootCAs:    m.clusterPool,
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			return m.frontend.Load(), nil
		},
	}
	// Internode: mutual TLS, both directions anchored on the internode CA only.
	m.internodeServer = &tls.Config{
		MinVersion:     tls.VersionTLS12,
		GetCertificate: getInternode,
		ClientAuth:     tls.RequireAndVerifyClientCert,
		ClientCAs:      m.internodePool,
	}
	// Peers are dialled by the IP they broadcast through membership; what identifies a
	// Temporal peer is its chain to the internode CA, so we verify the chain and not a
	// host name (no IP SAN needed in internode certificates).
	m.internodeClient = &tls.Config{
		MinVersion:         tls.VersionTLS12,
		InsecureSkipVerify: true, // replaced by VerifyConnection below
		VerifyConnection:   verifyChainOnly(m.internodePool),
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			return m.internode.Load(), nil
		},
	}
	return m, nil
}

// verifyChainOnly checks that the peer's certificate chains to pool (serverAuth EKU),
// without host name verification.
func verifyChainOnly(pool *x509.CertPool) func(tls.ConnectionState) error {
	return func(cs tls.ConnectionState) error {
		if len(cs.PeerCertificates) == 0 {
			return errors.New("peer presented no certificate")
		}
		inter := x509.NewCertPool()
		for _, c := range cs.PeerCertificates[1:] {
			inter.AddCert(c)
		}
		_, err := cs.PeerCertificates[0].Verify(x509.VerifyOptions{
			Roots:         pool,
			Intermediates: inter,
			KeyUsages:     []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		})
		return err
	}
}

func (m *memTLS) setLeaves(frontendCert, frontendKey, internodeCert, internodeKey string) error {
	fe, err := keyPair("frontendCert/frontendKey", frontendCert, frontendKey)
	if err != nil {
		return err
	}
	in, err := keyPair("internodeCert/internodeKey", internodeCert, internodeKey)
	if err != nil {
		return err
	}
	if err := checkLeaf("frontendCert", fe, m.clusterPool); err != nil {
		return err
	}
	if err := checkLeaf("internodeCert", in, m.internodePool); err != nil {
		return err
	}
	m.frontend.Store(fe)
	m.internode.Store(in)
	return nil
}

func checkLeaf(what string, kp *tls.Certificate, pool *x509.CertPool) error {
	leaf, err := x509.ParseCertificate(kp.Certificate[0])
	if err != nil {
		return fmt.Errorf("tls.%s: %w", what, err)
	}
	kp.Leaf = leaf
	inter := x509.NewCertPool()
	for _, der := range kp.Certificate[1:] {
		if c, err := x509.ParseCertificate(der); err == nil {
			inter.AddCert(c)
		}
	}
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: pool, Intermediates: inter,
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
		return fmt.Errorf("tls.%s is not signed by its CA: %w", what, err)
	}
	return nil
}

func (m *memTLS) GetInternodeServerConfig() (*tls.Config, error) { return m.internodeServer, nil }
func (m *memTLS) GetInternodeClientConfig() (*tls.Config, error) { return m.internodeClient, nil }
func (m *memTLS) GetFrontendServerConfig() (*tls.Config, error)  { return m.frontendServer, nil }
func (m *memTLS) GetFrontendClientConfig() (*tls.Config, error)  { return m.frontendClient, nil }
func (m *memTLS) GetRemoteClusterClientConfig(string) (*tls.Config, error) {
	return nil, nil
}
func (m *memTLS) GetExpiringCerts(time.Duration) (encryption.CertExpirationMap, encryption.CertExpirationMap, error) {
	return nil, nil, nil
}

// selfCheckConfig is what the host uses to health-check its own frontend: the frontend
// certificate as client certificate (needs EKU clientAuth), server verified by chain only.
func (m *memTLS) selfCheckConfig() *tls.Config {
	return &tls.Config{
		MinVersion:         tls.VersionTLS12,
		InsecureSkipVerify: true,
		VerifyConnection:   verifyChainOnly(m.clusterPool),
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			return m.frontend.Load(), nil
		},
	}
}
