package main

import (
	"encoding/json"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	"go.temporal.io/server/common/cluster"
	"go.temporal.io/server/common/config"
	"go.temporal.io/server/common/persistence/sql/sqlplugin/postgresql"
	sqliteplugin "go.temporal.io/server/common/persistence/sql/sqlplugin/sqlite"
)

// HostConfig is the single JSON document read from the first line of stdin.
// Every key is camelCase; unknown keys are rejected so typos fail loudly.
type HostConfig struct {
	Postgres         PostgresConfig `json:"postgres"`
	NumHistoryShards int32          `json:"numHistoryShards"`
	// Advertise is this server's IP: membership broadcast address and bind IP of every listener.
	Advertise string `json:"advertise"`
	// BindIP overrides the bind IP (e.g. "0.0.0.0"); default: Advertise.
	BindIP string `json:"bindIP,omitempty"`
	Ports  Ports  `json:"ports"`
	// ClusterName is Temporal's cluster name: fixed forever once the databases are initialised.
	ClusterName string `json:"clusterName,omitempty"`
	// ClusterID (a UUID) is used only when Temporal's cluster metadata is first written.
	ClusterID string  `json:"clusterId,omitempty"`
	TLS       TLSPEMs `json:"tls"`
	// Nodes is the initial authorization table (same shape as the "authz" command).
	Nodes map[string]*NodeEntry `json:"nodes,omitempty"`
	// Operators maps each operator to its grant: the decimal serial of its current
	// certificate (the only one of its certificates that may call), its role and its
	// tenants (same shape as the "operators" command).
	Operators map[string]*OperatorGrant `json:"operators,omitempty"`
	LogLevel  string                    `json:"logLevel,omitempty"`
	// DynamicConfig is passed to Temporal's dynamic config as static key -> value.
	DynamicConfig map[string]any `json:"dynamicConfig,omitempty"`
	// ReadyTimeoutSeconds bounds Start + first successful health check (default 120).
	ReadyTimeoutSeconds int `json:"readyTimeoutSeconds,omitempty"`
	// StopTimeoutSeconds bounds a graceful stop before the host exits anyway (default 20).
	StopTimeoutSeconds int `json:"stopTimeoutSeconds,omitempty"`
}

type PostgresConfig struct {
	// Host is a hostname/IP, or an absolute directory holding the unix socket.
	Host               string `json:"host"`
	Port               int    `json:"port"`
	User               string `json:"user"`
	Password           string `json:"password"`
	Database           string `json:"database"`           // Temporal's main store, e.g. oz0_temporal
	VisibilityDatabase string `json:"visibilityDatabase"` // e.g. oz0_temporal_visibility
	SSLMode            string `json:"sslmode,omitempty"`  // disable|require|verify-ca|verify-full (default disable)
	// SSLRootCertPEM is an optional CA for verify-ca/verify-full, passed inline (never a file).
	SSLRootCertPEM string `json:"sslRootCertPEM,omitempty"`
	// MaxConns bounds the one pool to Database that all of the server's Temporal services
	// share (sharedpool.go); VisibilityMaxConns bounds each service's own pool to
	// VisibilityDatabase (5 services per server).
	MaxConns           int `json:"maxConns,omitempty"`           // default 10
	VisibilityMaxConns int `json:"visibilityMaxConns,omitempty"` // default 4
	// AdminDatabase is used to CREATE DATABASE in setup-schema (default "postgres").
	AdminDatabase string `json:"adminDatabase,omitempty"`
	// CreateDatabases: setup-schema creates missing databases (default true).
	CreateDatabases *bool `json:"createDatabases,omitempty"`
	// VisibilitySqliteFile, when set, puts Temporal's visibility store in this SQLite file
	// instead of visibilityDatabase (for PostgreSQL builds without the btree_gin extension,
	// e.g. the pgserver wheel used by --dev).
	VisibilitySqliteFile string `json:"visibilitySqliteFile,omitempty"`
}

type Ports struct {
	Frontend                   int `json:"frontend,omitempty"`
	History                    int `json:"history,omitempty"`
	Matching                   int `json:"matching,omitempty"`
	InternalFrontend           int `json:"internalFrontend,omitempty"`
	Worker                     int `json:"worker,omitempty"`
	FrontendMembership         int `json:"frontendMembership,omitempty"`
	HistoryMembership          int `json:"historyMembership,omitempty"`
	MatchingMembership         int `json:"matchingMembership,omitempty"`
	InternalFrontendMembership int `json:"internalFrontendMembership,omitempty"`
	WorkerMembership           int `json:"workerMembership,omitempty"`
}

// TLSPEMs are PEM strings; nothing is ever written to disk.
type TLSPEMs struct {
	ClusterCA     string `json:"clusterCA"`    // trusts clients of the frontend (nodes, operators, servers)
	FrontendCert  string `json:"frontendCert"` // signed by the cluster CA; EKU serverAuth (+clientAuth for the self-check)
	FrontendKey   string `json:"frontendKey"`
	InternodeCA   string `json:"internodeCA"`   // trusts other servers' Temporal services
	InternodeCert string `json:"internodeCert"` // signed by the internode CA; EKU serverAuth+clientAuth
	InternodeKey  string `json:"internodeKey"`
}

func parseConfig(line []byte) (*HostConfig, error) {
	dec := json.NewDecoder(strings.NewReader(string(line)))
	dec.DisallowUnknownFields()
	var c HostConfig
	if err := dec.Decode(&c); err != nil {
		return nil, fmt.Errorf("config JSON: %w", err)
	}
	c.applyDefaults()
	return &c, nil
}

func (c *HostConfig) applyDefaults() {
	p := &c.Ports
	def := func(v *int, d int) {
		if *v == 0 {
			*v = d
		}
	}
	def(&p.Frontend, 7233)
	def(&p.History, 7234)
	def(&p.Matching, 7235)
	def(&p.InternalFrontend, 7236)
	def(&p.Worker, 7239)
	def(&p.FrontendMembership, 6933)
	def(&p.HistoryMembership, 6934)
	def(&p.MatchingMembership, 6935)
	def(&p.InternalFrontendMembership, 6936)
	def(&p.WorkerMembership, 6939)
	def(&c.Postgres.Port, 5432)
	def(&c.Postgres.MaxConns, 10)
	def(&c.Postgres.VisibilityMaxConns, 4)
	def(&c.ReadyTimeoutSeconds, 120)
	def(&c.StopTimeoutSeconds, 20)
	if c.Postgres.SSLMode == "" {
		c.Postgres.SSLMode = "disable"
	}
	if c.Postgres.AdminDatabase == "" {
		c.Postgres.AdminDatabase = "postgres"
	}
	if c.ClusterName == "" {
		c.ClusterName = "oz0"
	}
	if c.LogLevel == "" {
		c.LogLevel = "warn"
	}
	if c.BindIP == "" {
		c.BindIP = c.Advertise
	}
}

func (c *HostConfig) validateDB() error {
	pg := c.Postgres
	switch {
	case pg.Host == "":
		return fmt.Errorf("postgres.host is required")
	case pg.User == "":
		return fmt.Errorf("postgres.user is required")
	case pg.Database == "" || (pg.VisibilityDatabase == "" && pg.VisibilitySqliteFile == ""):
		return fmt.Errorf("postgres.database and postgres.visibilityDatabase (or visibilitySqliteFile) are required")
	}
	return nil
}

func (c *HostConfig) validateServe() error {
	if err := c.validateDB(); err != nil {
		return err
	}
	if c.NumHistoryShards <= 0 {
		return fmt.Errorf("numHistoryShards must be > 0")
	}
	// Temporal's membership needs an IP, not a name, as broadcast address.
	if ip := net.ParseIP(c.Advertise); ip == nil || ip.IsUnspecified() {
		return fmt.Errorf("advertise must be a concrete IP address, got %q", c.Advertise)
	}
	if net.ParseIP(c.BindIP) == nil {
		return fmt.Errorf("bindIP must be an IP address, got %q", c.BindIP)
	}
	t := c.TLS
	if t.ClusterCA == "" || t.FrontendCert == "" || t.FrontendKey == "" ||
		t.InternodeCA == "" || t.InternodeCert == "" || t.InternodeKey == "" {
		return fmt.Errorf("tls: clusterCA, frontendCert, frontendKey, internodeCA, internodeCert, internodeKey are all required")
	}
	return nil
}

// sqlConfig builds Temporal's SQL store config for one database.
func (c *HostConfig) sqlConfig(database string, maxConns int) *config.SQL {
	pg := c.Postgres
	attrs := map[string]string{"sslmode": pg.SSLMode}
	addr := net.JoinHostPort(pg.Host, strconv.Itoa(pg.Port))
	if strings.HasPrefix(pg.Host, "/") {
		// Unix socket directory. Temporal builds "postgres://u:p@<connectAddr>/db?<attrs>" and
		// lib/pq turns it into sorted key=value pairs, so the URL must carry no host of its
		// own (":<port>" keeps the port, which names the socket file .s.PGSQL.<port>) and
		// the directory goes in as the "host" attribute.
		attrs["host"] = pg.Host
		addr = ":" + strconv.Itoa(pg.Port)
	}
	if pg.SSLRootCertPEM != "" {
		attrs["sslinline"] = "true"
		attrs["sslrootcert"] = pg.SSLRootCertPEM
	}
	return &config.SQL{
		PluginName:        postgresql.PluginName, // "postgres12" (lib/pq)
		DatabaseName:      database,
		ConnectAddr:       addr,
		ConnectProtocol:   "tcp",
		User:              pg.User,
		Password:          pg.Password,
		ConnectAttributes: attrs,
		MaxConns:          maxConns,
		MaxIdleConns:      maxConns,
		MaxConnLifetime:   time.Hour,
	}
}

func (c *HostConfig) visibilitySQLConfig() *config.SQL {
	if f := c.Postgres.VisibilitySqliteFile; f != "" {
		return &config.SQL{
			PluginName:        sqliteplugin.PluginName,
			DatabaseName:      f,
			ConnectAddr:       "localhost",
			ConnectProtocol:   "tcp",
			ConnectAttributes: map[string]string{"mode": "rwc", "_journal_mode": "WAL", "_busy_timeout": "5000"},
		}
	}
	return c.sqlConfig(c.Postgres.VisibilityDatabase, c.Postgres.VisibilityMaxConns)
}

// temporalConfig builds the whole server config in memory (no YAML file).
func (c *HostConfig) temporalConfig() *config.Config {
	var conf config.Config
	conf.Log.Level = c.LogLevel
	conf.Global.Membership.MaxJoinDuration = 30 * time.Second
	conf.Global.Membership.BroadcastAddress = c.Advertise

	conf.Persistence.DefaultStore = "default"
	conf.Persistence.VisibilityStore = "visibility"
	conf.Persistence.NumHistoryShards = c.NumHistoryShards
	conf.Persistence.DataStores = map[string]config.DataStore{
		"default":    {SQL: c.sqlConfig(c.Postgres.Database, c.Postgres.MaxConns)},
		"visibility": {SQL: c.visibilitySQLConfig()},
	}

	frontendAddr := net.JoinHostPort(c.Advertise, strconv.Itoa(c.Ports.Frontend))
	conf.ClusterMetadata = &cluster.Config{
		EnableGlobalNamespace:    false,
		FailoverVersionIncrement: 10,
		MasterClusterName:        c.ClusterName,
		CurrentClusterName:       c.ClusterName,
		ClusterInformation: map[string]cluster.ClusterInformation{
			c.ClusterName: {
				Enabled:                true,
				InitialFailoverVersion: 1,
				RPCAddress:             frontendAddr,
				ClusterID:              c.ClusterID,
			},
		},
	}
	conf.DCRedirectionPolicy.Policy = "noop"
	svc := func(grpcPort, membershipPort int) config.Service {
		var s config.Service
		s.RPC.GRPCPort = grpcPort
		s.RPC.MembershipPort = membershipPort
		s.RPC.BindOnIP = c.BindIP
		return s
	}
	conf.Services = map[string]config.Service{
		"frontend":          svc(c.Ports.Frontend, c.Ports.FrontendMembership),
		"internal-frontend": svc(c.Ports.InternalFrontend, c.Ports.InternalFrontendMembership),
		"history":           svc(c.Ports.History, c.Ports.HistoryMembership),
		"matching":          svc(c.Ports.Matching, c.Ports.MatchingMembership),
		"worker":            svc(c.Ports.Worker, c.Ports.WorkerMembership),
	}
	conf.Archival.History.State = "disabled"
	conf.Archival.Visibility.State = "disabled"
	conf.NamespaceDefaults.Archival.History.State = "disabled"
	conf.NamespaceDefaults.Archival.Visibility.State = "disabled"
	// PublicClient.HostPort stays empty: with an "internal-frontend" service configured, the
	// system worker reaches it through membership using the internode TLS config.
	return &conf
}

var allServices = []string{"frontend", "internal-frontend", "history", "matching", "worker"}
