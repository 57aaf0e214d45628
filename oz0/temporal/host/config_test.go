package main

import (
	"encoding/json"
	"strings"
	"testing"
)

// validConfigJSON is a complete serve config; PEM values are placeholders (validation only
// checks presence).
const validConfigJSON = `{
	"postgres": {"host": "10.0.0.5", "user": "temporal", "password": "pw",
		"database": "oz0_temporal", "visibilityDatabase": "oz0_temporal_visibility"},
	"numHistoryShards": 4,
	"advertise": "10.0.0.7",
	"tls": {"clusterCA": "ca", "frontendCert": "fc", "frontendKey": "fk",
		"internodeCA": "ica", "internodeCert": "ic", "internodeKey": "ik"},
	"nodes": {"n1": {"tenant": "acme", "state": "accepted"}, "n2": null}
}`

func mustParse(t *testing.T, s string) *HostConfig {
	t.Helper()
	c, err := parseConfig([]byte(compactJSON(t, s)))
	if err != nil {
		t.Fatalf("parseConfig: %v", err)
	}
	return c
}

// compactJSON puts a JSON document on one line, as the parent sends it.
func compactJSON(t *testing.T, s string) string {
	t.Helper()
	var v any
	if err := json.Unmarshal([]byte(s), &v); err != nil {
		t.Fatalf("test JSON: %v", err)
	}
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// withJSON returns validConfigJSON with edit applied to its decoded form.
func withJSON(t *testing.T, edit func(m map[string]any)) string {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal([]byte(validConfigJSON), &m); err != nil {
		t.Fatal(err)
	}
	edit(m)
	b, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestParseConfigValid(t *testing.T) {
	c := mustParse(t, validConfigJSON)
	if c.Postgres.Host != "10.0.0.5" || c.Postgres.User != "temporal" || c.Postgres.Password != "pw" ||
		c.Postgres.Database != "oz0_temporal" || c.Postgres.VisibilityDatabase != "oz0_temporal_visibility" {
		t.Fatalf("postgres = %+v", c.Postgres)
	}
	if c.NumHistoryShards != 4 || c.Advertise != "10.0.0.7" {
		t.Fatalf("numHistoryShards=%d advertise=%q", c.NumHistoryShards, c.Advertise)
	}
	if c.TLS != (TLSPEMs{"ca", "fc", "fk", "ica", "ic", "ik"}) {
		t.Fatalf("tls = %+v", c.TLS)
	}
	if len(c.Nodes) != 2 || c.Nodes["n1"] == nil || *c.Nodes["n1"] != (NodeEntry{Tenant: "acme", State: "accepted"}) {
		t.Fatalf("nodes = %v", c.Nodes)
	}
	if e, ok := c.Nodes["n2"]; !ok || e != nil {
		t.Fatalf("nodes[n2] = %v (present %v), want a nil entry", e, ok)
	}
	// defaults are applied by parseConfig
	if c.Ports.Frontend != 7233 || c.BindIP != "10.0.0.7" {
		t.Fatalf("defaults not applied: ports=%+v bindIP=%q", c.Ports, c.BindIP)
	}
	if err := c.validateServe(); err != nil {
		t.Fatalf("validateServe: %v", err)
	}
	if err := c.validateDB(); err != nil {
		t.Fatalf("validateDB: %v", err)
	}
}

func TestParseConfigRejectsUnknownKeys(t *testing.T) {
	cases := map[string]string{
		"top level": withJSON(t, func(m map[string]any) { m["advertize"] = "10.0.0.7" }),
		"postgres":  withJSON(t, func(m map[string]any) { m["postgres"].(map[string]any)["hostname"] = "db" }),
		"ports":     withJSON(t, func(m map[string]any) { m["ports"] = map[string]any{"frontendPort": 1} }),
		"tls":       withJSON(t, func(m map[string]any) { m["tls"].(map[string]any)["frontendCertFile"] = "/x" }),
		"node entry": withJSON(t, func(m map[string]any) {
			m["nodes"] = map[string]any{"n1": map[string]any{"tenant": "a", "status": "accepted"}}
		}),
		"snake_case":    withJSON(t, func(m map[string]any) { m["num_history_shards"] = 4 }),
		"only unknown":  `{"foo":1}`,
		"unknown empty": `{"":1}`,
	}
	for name, line := range cases {
		t.Run(name, func(t *testing.T) {
			c, err := parseConfig([]byte(line))
			if err == nil {
				t.Fatalf("parseConfig accepted %s", line)
			}
			if c != nil {
				t.Fatalf("parseConfig returned a config with an error")
			}
			if !strings.Contains(err.Error(), "unknown field") {
				t.Fatalf("error %q does not name the unknown field", err)
			}
		})
	}
}

func TestParseConfigRejectsMalformedJSON(t *testing.T) {
	for _, line := range []string{``, `{`, `not json`, `{"advertise": 7}`, `{"numHistoryShards": "4"}`, `[]`} {
		if c, err := parseConfig([]byte(line)); err == nil || c != nil {
			t.Errorf("parseConfig(%q) = (%v, %v), want an error", line, c, err)
		}
	}
}

func TestApplyDefaults(t *testing.T) {
	var c HostConfig
	c.Advertise = "10.1.2.3"
	c.applyDefaults()
	want := Ports{
		Frontend:                   7233,
		History:                    7234,
		Matching:                   7235,
		InternalFrontend:           7236,
		Worker:                     7239,
		FrontendMembership:         6933,
		HistoryMembership:          6934,
		MatchingMembership:         6935,
		InternalFrontendMembership: 6936,
		WorkerMembership:           6939,
	}
	if c.Ports != want {
		t.Fatalf("ports = %+v, want %+v", c.Ports, want)
	}
	if c.BindIP != "10.1.2.3" {
		t.Fatalf("bindIP = %q, want the advertise address", c.BindIP)
	}
	pg := c.Postgres
	if pg.Port != 5432 || pg.MaxConns != 10 || pg.VisibilityMaxConns != 4 || pg.SSLMode != "disable" || pg.AdminDatabase != "postgres" {
		t.Fatalf("postgres defaults = %+v", pg)
	}
	if pg.CreateDatabases != nil {
		t.Fatalf("createDatabases default changed to %v", *pg.CreateDatabases)
	}
	if c.ReadyTimeoutSeconds != 120 || c.StopTimeoutSeconds != 20 {
		t.Fatalf("timeouts = %d/%d, want 120/20", c.ReadyTimeoutSeconds, c.StopTimeoutSeconds)
	}
	if c.ClusterName != "oz0" || c.LogLevel != "warn" {
		t.Fatalf("clusterName=%q logLevel=%q, want oz0/warn", c.ClusterName, c.LogLevel)
	}
	if c.NumHistoryShards != 0 || c.ClusterID != "" {
		t.Fatalf("numHistoryShards/clusterId got a default: %d %q", c.NumHistoryShards, c.ClusterID)
	}
}

func TestApplyDefaultsKeepsExplicitValues(t *testing.T) {
	c := mustParse(t, withJSON(t, func(m map[string]any) {
		m["bindIP"] = "0.0.0.0"
		m["clusterName"] = "prod"
		m["logLevel"] = "debug"
		m["readyTimeoutSeconds"] = 5
		m["stopTimeoutSeconds"] = 6
		m["ports"] = map[string]any{
			"frontend": 17233, "history": 17234, "matching": 17235, "internalFrontend": 17236, "worker": 17239,
			"frontendMembership": 16933, "historyMembership": 16934, "matchingMembership": 16935,
			"internalFrontendMembership": 16936, "workerMembership": 16939,
		}
		pg := m["postgres"].(map[string]any)
		pg["port"] = 6543
		pg["maxConns"] = 3
		pg["visibilityMaxConns"] = 2
		pg["sslmode"] = "verify-full"
		pg["adminDatabase"] = "template1"
	}))
	want := Ports{17233, 17234, 17235, 17236, 17239, 16933, 16934, 16935, 16936, 16939}
	if c.Ports != want {
		t.Fatalf("ports = %+v, want %+v", c.Ports, want)
	}
	if c.BindIP != "0.0.0.0" || c.Advertise != "10.0.0.7" {
		t.Fatalf("bindIP=%q advertise=%q", c.BindIP, c.Advertise)
	}
	if c.ClusterName != "prod" || c.LogLevel != "debug" || c.ReadyTimeoutSeconds != 5 || c.StopTimeoutSeconds != 6 {
		t.Fatalf("explicit values overridden: %+v", c)
	}
	pg := c.Postgres
	if pg.Port != 6543 || pg.MaxConns != 3 || pg.VisibilityMaxConns != 2 || pg.SSLMode != "verify-full" || pg.AdminDatabase != "template1" {
		t.Fatalf("postgres = %+v", pg)
	}
	// partially given ports: the rest get defaults
	c = mustParse(t, withJSON(t, func(m map[string]any) { m["ports"] = map[string]any{"frontend": 8000} }))
	if c.Ports.Frontend != 8000 || c.Ports.History != 7234 || c.Ports.FrontendMembership != 6933 || c.Ports.WorkerMembership != 6939 {
		t.Fatalf("ports = %+v", c.Ports)
	}
}

func TestValidateDB(t *testing.T) {
	cases := []struct {
		name    string
		edit    func(pg map[string]any)
		wantErr string // "" = valid
	}{
		{"valid", func(pg map[string]any) {}, ""},
		{"unix socket host", func(pg map[string]any) { pg["host"] = "/run/postgresql" }, ""},
		{"sqlite visibility instead of database", func(pg map[string]any) {
			delete(pg, "visibilityDatabase")
			pg["visibilitySqliteFile"] = "/var/lib/oz0/visibility.db"
		}, ""},
		{"missing host", func(pg map[string]any) { delete(pg, "host") }, "postgres.host"},
		{"missing user", func(pg map[string]any) { delete(pg, "user") }, "postgres.user"},
		{"missing database", func(pg map[string]any) { delete(pg, "database") }, "postgres.database"},
		{"missing visibility database", func(pg map[string]any) { delete(pg, "visibilityDatabase") }, "visibilityDatabase"},
		{"missing both databases", func(pg map[string]any) { delete(pg, "database"); delete(pg, "visibilityDatabase") }, "postgres.database"},
		{"sqlite visibility but no main database", func(pg map[string]any) {
			delete(pg, "database")
			pg["visibilitySqliteFile"] = "/var/lib/oz0/visibility.db"
		}, "postgres.database"},
		{"no postgres at all", nil, "postgres.host"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := mustParse(t, withJSON(t, func(m map[string]any) {
				if tc.edit == nil {
					delete(m, "postgres")
					return
				}
				tc.edit(m["postgres"].(map[string]any))
			}))
			for fn, err := range map[string]error{"validateDB": c.validateDB(), "validateServe": c.validateServe()} {
				if tc.wantErr == "" {
					if err != nil {
						t.Fatalf("%s: %v", fn, err)
					}
					continue
				}
				if err == nil {
					t.Fatalf("%s accepted the config, want an error about %s", fn, tc.wantErr)
				}
				if !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("%s: error %q does not mention %s", fn, err, tc.wantErr)
				}
			}
		})
	}
}

func TestValidateServe(t *testing.T) {
	cases := []struct {
		name    string
		edit    func(m map[string]any)
		wantErr string // "" = valid
	}{
		{"valid", func(m map[string]any) {}, ""},
		{"IPv6 advertise", func(m map[string]any) { m["advertise"] = "fd00::7" }, ""},
		{"bind all interfaces", func(m map[string]any) { m["bindIP"] = "0.0.0.0" }, ""},
		{"bind all IPv6 interfaces", func(m map[string]any) { m["bindIP"] = "::" }, ""},

		{"missing advertise", func(m map[string]any) { delete(m, "advertise") }, "advertise"},
		{"missing advertise with bindIP", func(m map[string]any) { delete(m, "advertise"); m["bindIP"] = "0.0.0.0" }, "advertise"},
		{"hostname advertise", func(m map[string]any) { m["advertise"] = "temporal.internal" }, "advertise"},
		{"hostname advertise with bindIP", func(m map[string]any) { m["advertise"] = "localhost"; m["bindIP"] = "127.0.0.1" }, "advertise"},
		{"advertise with port", func(m map[string]any) { m["advertise"] = "10.0.0.7:7233" }, "advertise"},
		{"advertise CIDR", func(m map[string]any) { m["advertise"] = "10.0.0.7/24" }, "advertise"},
		{"unspecified IPv4 advertise", func(m map[string]any) { m["advertise"] = "0.0.0.0" }, "advertise"},
		{"unspecified IPv6 advertise", func(m map[string]any) { m["advertise"] = "::" }, "advertise"},
		{"hostname bindIP", func(m map[string]any) { m["bindIP"] = "localhost" }, "bindIP"},

		{"zero shards", func(m map[string]any) { m["numHistoryShards"] = 0 }, "numHistoryShards"},
		{"missing shards", func(m map[string]any) { delete(m, "numHistoryShards") }, "numHistoryShards"},
		{"negative shards", func(m map[string]any) { m["numHistoryShards"] = -1 }, "numHistoryShards"},

		{"missing databases", func(m map[string]any) {
			pg := m["postgres"].(map[string]any)
			delete(pg, "database")
			delete(pg, "visibilityDatabase")
		}, "postgres.database"},
		{"missing tls", func(m map[string]any) { delete(m, "tls") }, "tls"},
	}
	for _, k := range []string{"clusterCA", "frontendCert", "frontendKey", "internodeCA", "internodeCert", "internodeKey"} {
		cases = append(cases, struct {
			name    string
			edit    func(m map[string]any)
			wantErr string
		}{"missing tls." + k, func(m map[string]any) { delete(m["tls"].(map[string]any), k) }, "tls"})
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := mustParse(t, withJSON(t, tc.edit))
			err := c.validateServe()
			if tc.wantErr == "" {
				if err != nil {
					t.Fatalf("validateServe: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("validateServe accepted the config, want an error about %s", tc.wantErr)
			}
			if !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("error %q does not mention %s", err, tc.wantErr)
			}
		})
	}
}

func TestTemporalConfigUsesPortsAndAddresses(t *testing.T) {
	c := mustParse(t, withJSON(t, func(m map[string]any) {
		m["bindIP"] = "0.0.0.0"
		m["ports"] = map[string]any{"frontend": 17233, "workerMembership": 16939}
	}))
	conf := c.temporalConfig()
	if conf.Global.Membership.BroadcastAddress != "10.0.0.7" {
		t.Fatalf("broadcast address = %q", conf.Global.Membership.BroadcastAddress)
	}
	want := map[string][2]int{
		"frontend":          {17233, 6933},
		"history":           {7234, 6934},
		"matching":          {7235, 6935},
		"internal-frontend": {7236, 6936},
		"worker":            {7239, 16939},
	}
	if len(conf.Services) != len(want) || len(allServices) != len(want) {
		t.Fatalf("services = %v, allServices = %v", conf.Services, allServices)
	}
	for _, name := range allServices {
		s, ok := conf.Services[name]
		if !ok {
			t.Fatalf("service %s missing", name)
		}
		if s.RPC.GRPCPort != want[name][0] || s.RPC.MembershipPort != want[name][1] || s.RPC.BindOnIP != "0.0.0.0" {
			t.Fatalf("service %s rpc = %+v, want ports %v bind 0.0.0.0", name, s.RPC, want[name])
		}
	}
	ci := conf.ClusterMetadata.ClusterInformation["oz0"]
	if conf.ClusterMetadata.CurrentClusterName != "oz0" || ci.RPCAddress != "10.0.0.7:17233" {
		t.Fatalf("cluster metadata = %+v / %+v", conf.ClusterMetadata, ci)
	}
	if conf.Persistence.NumHistoryShards != 4 {
		t.Fatalf("numHistoryShards = %d", conf.Persistence.NumHistoryShards)
	}
}

func TestSQLConfig(t *testing.T) {
	c := mustParse(t, validConfigJSON)
	s := c.sqlConfig("oz0_temporal", 10)
	if s.ConnectAddr != "10.0.0.5:5432" || s.DatabaseName != "oz0_temporal" || s.ConnectAttributes["sslmode"] != "disable" {
		t.Fatalf("tcp sql config = %+v", s)
	}
	if _, ok := s.ConnectAttributes["host"]; ok {
		t.Fatalf("tcp sql config has a host attribute: %v", s.ConnectAttributes)
	}

	c = mustParse(t, withJSON(t, func(m map[string]any) {
		pg := m["postgres"].(map[string]any)
		pg["host"] = "/run/postgresql"
		pg["port"] = 5433
	}))
	s = c.sqlConfig("oz0_temporal", 10)
	if s.ConnectAddr != ":5433" || s.ConnectAttributes["host"] != "/run/postgresql" {
		t.Fatalf("unix socket sql config = %+v", s)
	}

	v := mustParse(t, validConfigJSON).visibilitySQLConfig()
	if v.DatabaseName != "oz0_temporal_visibility" || v.MaxConns != 4 {
		t.Fatalf("visibility sql config = %+v", v)
	}
	c = mustParse(t, withJSON(t, func(m map[string]any) {
		m["postgres"].(map[string]any)["visibilitySqliteFile"] = "/tmp/vis.db"
	}))
	v = c.visibilitySQLConfig()
	if v.DatabaseName != "/tmp/vis.db" || v.PluginName == s.PluginName {
		t.Fatalf("sqlite visibility config = %+v", v)
	}
}
