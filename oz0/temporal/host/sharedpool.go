package main

import (
	"sync"

	"go.temporal.io/server/common/log"
	"go.temporal.io/server/common/log/tag"
	"go.temporal.io/server/common/persistence"
	persistenceclient "go.temporal.io/server/common/persistence/client"
	"go.temporal.io/server/common/persistence/sql"
	"go.temporal.io/server/common/persistence/sql/sqlplugin"
	"go.temporal.io/server/common/resolver"
)

// sharedMainStore gives every user of Temporal's main database in this process one SQL
// store, so one database/sql pool: Temporal builds a store, each with its own pool
// (sql.NewFactory), for each of its five services, for its cluster-metadata check and for
// its system-namespace registration. Each pool opens the connections its own bursts need
// and keeps them idle, so a server start opened ~24 connections to the main database
// where one pool of maxConns serves them all; each connection costs PostgreSQL a backend
// and a password exchange.
//
// It is Temporal's persistence-factory hook (temporal.WithPersistenceFactoryProvider)
// around Temporal's own provider: only the store underneath is swapped, so rate limits,
// retries and metrics stay Temporal's, and the store itself is Temporal's SQL store built
// from the same config. The store each service built (params.DataStoreFactory) is left
// unused; it connects only when asked for a store, so it opens nothing.
//
// Visibility stays per service: Temporal builds each service's visibility store from
// config.SQL itself (visibility.NewManager), with no hook but a custom store type.
type sharedMainStore struct {
	logger log.Logger

	once  sync.Once
	store *sql.Factory
	// hold is the host's own reference to the store's refcounted pool (sql.DbConn): without
	// it the pool closes whenever its last user closes, e.g. between the cluster-metadata
	// check and the services, and the next user opens a new one.
	hold sqlplugin.DB
}

func newSharedMainStore(logger log.Logger) *sharedMainStore {
	return &sharedMainStore{logger: logger}
}

// provider is the persistenceclient.FactoryProviderFn handed to Temporal.
func (s *sharedMainStore) provider(p persistenceclient.NewFactoryParams) persistenceclient.Factory {
	s.once.Do(func() {
		ds, ok := p.Cfg.DataStores[p.Cfg.DefaultStore]
		if !ok || ds.SQL == nil {
			return // not an SQL store: Temporal's own, per service
		}
		// Built at the first call, from the config Temporal has validated by then (it
		// fills in defaults such as TaskScanPartitions). The resolver is the one Temporal
		// uses when none is given (the host gives none); the metrics handler is the
		// first caller's (the server's, at its cluster-metadata check).
		s.store = sql.NewFactory(*ds.SQL, resolver.NewNoopResolver(), string(p.ClusterName),
			s.logger, p.MetricsHandler, p.Serializer)
		hold, err := s.store.GetDB()
		if err != nil {
			// Every store of the pool would fail the same way: Temporal reports it.
			s.logger.Warn("shared SQL store: no pool", tag.Error(err))
			return
		}
		s.hold = hold
	})
	if s.store != nil {
		p.DataStoreFactory = unclosedStore{s.store}
	}
	return persistenceclient.FactoryProvider(p)
}

// close closes the shared pool whatever references remain: after srv.Stop, when every
// service has stopped.
func (s *sharedMainStore) close() {
	if s.store != nil {
		s.store.Close()
	}
}

// unclosedStore is the shared store as each user sees it. Temporal closes a user's
// DataStoreFactory when that user is done (a service at its stop, the one-shot checks at
// their end), and sql.Factory.Close closes the pool regardless of its references; the
// host closes it once, in sharedMainStore.close. The stores it vends are closed as usual:
// each gives back its reference to the pool.
type unclosedStore struct {
	persistence.DataStoreFactory
}

func (unclosedStore) Close() {}
