package main

import (
	"context"
	"path/filepath"
	"sync/atomic"
	"testing"

	"go.temporal.io/server/common/config"
	"go.temporal.io/server/common/log"
	"go.temporal.io/server/common/metrics"
	"go.temporal.io/server/common/persistence"
	persistenceclient "go.temporal.io/server/common/persistence/client"
	"go.temporal.io/server/common/persistence/serialization"
	"go.temporal.io/server/common/persistence/sql"
	"go.temporal.io/server/common/persistence/sql/sqlplugin"
	sqliteplugin "go.temporal.io/server/common/persistence/sql/sqlplugin/sqlite"
	"go.temporal.io/server/common/resolver"
	sqliteschema "go.temporal.io/server/schema/sqlite"
)

// countingPlugin is Temporal's SQLite plugin that counts the pools (sqlplugin.DB) made and
// closed: each SQL store made by sql.NewFactory makes one when first used and closes it at
// its Close. SQLite stands in for PostgreSQL (the sharing is above the plugin); its own
// plugin closes nothing, so it cannot tell.
type countingPlugin struct{ made, closed atomic.Int32 }

const countingPluginName = "oz0-test-counting-sqlite"

var counting = &countingPlugin{}

func init() { sql.RegisterPlugin(countingPluginName, counting) }

func (p *countingPlugin) CreateDB(kind sqlplugin.DbKind, cfg *config.SQL, r resolver.ServiceResolver,
	l log.Logger, mh metrics.Handler) (sqlplugin.GenericDB, error) {
	c := *cfg
	c.PluginName = sqliteplugin.PluginName
	db, err := sql.NewSQLDB(kind, &c, r, l, mh)
	if err != nil {
		return nil, err
	}
	p.made.Add(1)
	return countedDB{db, p}, nil
}

func (p *countingPlugin) GetVisibilityQueryConverter() sqlplugin.VisibilityQueryConverter {
	return nil
}

type countedDB struct {
	sqlplugin.DB
	p *countingPlugin
}

func (d countedDB) Close() error {
	d.p.closed.Add(1)
	return d.DB.Close()
}

// ownStore is the store Temporal builds for each user; with the shared store it must stay
// unused (any call but Close panics on the nil interface it embeds).
type ownStore struct {
	persistence.DataStoreFactory
}

func (ownStore) Close() {}

// Every user gets the one store and its one pool; a user's Close (a service stopping, the
// one-shot checks ending) leaves the pool open for the others and for later users; the
// host's close closes it.
func TestSharedMainStoreOutlivesItsUsersUntilTheHostCloses(t *testing.T) {
	file := filepath.Join(t.TempDir(), "main.db")
	sqlCfg := &config.SQL{
		PluginName:        countingPluginName,
		DatabaseName:      file,
		ConnectAddr:       "localhost",
		ConnectProtocol:   "tcp",
		ConnectAttributes: map[string]string{"mode": "rwc"},
	}
	schemaCfg := *sqlCfg
	schemaCfg.PluginName = sqliteplugin.PluginName
	if err := sqliteschema.SetupSchema(&schemaCfg); err != nil {
		t.Fatal(err)
	}
	pcfg := &config.Persistence{
		DefaultStore:    "default",
		VisibilityStore: "default",
		DataStores:      map[string]config.DataStore{"default": {SQL: sqlCfg}},
	}
	if err := pcfg.Validate(); err != nil {
		t.Fatal(err)
	}
	shared := newSharedMainStore(log.NewNoopLogger())
	params := persistenceclient.NewFactoryParams{
		DataStoreFactory: ownStore{},
		Cfg:              pcfg,
		ClusterName:      "oz0",
		MetricsHandler:   metrics.NoopMetricsHandler,
		Logger:           log.NewNoopLogger(),
		Serializer:       serialization.NewSerializer(),
	}
	ctx := context.Background()
	use := func(f persistenceclient.Factory) persistence.MetadataManager {
		t.Helper()
		m, err := f.NewMetadataManager()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := m.GetMetadata(ctx); err != nil {
			t.Fatal(err)
		}
		return m
	}
	pools := func(made, closed int32) {
		t.Helper()
		if m, c := counting.made.Load(), counting.closed.Load(); m != made || c != closed {
			t.Fatalf("pools made %d, closed %d; want %d, %d", m, c, made, closed)
		}
	}

	// The one-shot check: all it had closed before the next user comes.
	check := shared.provider(params)
	use(check).Close()
	check.Close()
	pools(1, 0)

	// Two services; one stops.
	stopping, staying := shared.provider(params), shared.provider(params)
	m1, m2 := use(stopping), use(staying)
	m1.Close()
	stopping.Close()
	if _, err := m2.GetMetadata(ctx); err != nil {
		t.Fatalf("after another user closed: %v", err)
	}
	pools(1, 0)

	m2.Close()
	staying.Close()
	shared.close()
	pools(1, 1)
}
