package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"os"
	"time"

	"github.com/lib/pq"
	"go.temporal.io/server/common/log"
	pgv12 "go.temporal.io/server/schema/postgresql/v12"
	sqliteschema "go.temporal.io/server/schema/sqlite"
	"go.temporal.io/server/tools/common/schema"
	sqltool "go.temporal.io/server/tools/sql"
)

// Embedded schema directories (go.temporal.io/server/schema, //go:embed).
const (
	schemaMain       = "postgresql/v12/temporal"
	schemaVisibility = "postgresql/v12/visibility"
)

type schemaResult struct {
	Database string `json:"database"`
	Created  bool   `json:"created"`
	From     string `json:"from"`
	To       string `json:"to"`
	Expected string `json:"expected"`
}

// setupSchemas creates (if needed) and migrates both databases. Idempotent: a database at
// an older version gets only the newer versioned steps; one at the current version gets none.
func setupSchemas(c *HostConfig, logger log.Logger) ([]schemaResult, error) {
	var out []schemaResult
	dbs := []struct{ db, dir, want string }{{c.Postgres.Database, schemaMain, pgv12.Version}}
	if f := c.Postgres.VisibilitySqliteFile; f != "" {
		r, err := setupSqliteVisibility(f)
		out = append(out, r)
		if err != nil {
			return out, fmt.Errorf("%s: %w", f, err)
		}
	} else {
		dbs = append(dbs, struct{ db, dir, want string }{c.Postgres.VisibilityDatabase, schemaVisibility, pgv12.VisibilityVersion})
	}
	for _, d := range dbs {
		r, err := setupOne(c, d.db, d.dir, logger)
		if err != nil {
			return out, fmt.Errorf("%s: %w", d.db, err)
		}
		r.Expected = d.want
		out = append(out, r)
	}
	return out, nil
}

func setupOne(c *HostConfig, db, dir string, logger log.Logger) (schemaResult, error) {
	res := schemaResult{Database: db}
	created, err := ensureDatabase(c, db, logger)
	if err != nil {
		return res, err
	}
	res.Created = created

	conn, err := sqltool.NewConnection(c.sqlConfig(db, 2), logger)
	if err != nil {
		return res, fmt.Errorf("connect: %w", err)
	}
	defer conn.Close()

	if v, err := conn.ReadSchemaVersion(); err == nil {
		res.From = v
	} else {
		res.From = "" // no schema_version table yet
	}
	// "setup-schema -v 0.0": creates the schema_version tables (IF NOT EXISTS) and records
	// 0.0 only when the database has no newer version; no schema file is applied.
	if err := schema.NewSetupSchemaTask(conn, &schema.SetupConfig{InitialVersion: "0.0"}, logger).Run(); err != nil {
		return res, fmt.Errorf("setup: %w", err)
	}
	// "update-schema -d <embedded versioned dir>": applies every version newer than the current.
	if err := schema.NewUpdateSchemaTask(conn, &schema.UpdateConfig{SchemaName: dir}, logger).Run(); err != nil {
		return res, fmt.Errorf("update: %w", err)
	}
	v, err := conn.ReadSchemaVersion()
	if err != nil {
		return res, fmt.Errorf("read version: %w", err)
	}
	res.To = v
	return res, nil
}

// ensureDatabase creates db when it does not exist and createDatabases allows it.
// It talks to PostgreSQL directly (lib/pq) because Temporal's SQL handle hides the
// driver's error codes.
func ensureDatabase(c *HostConfig, db string, _ log.Logger) (bool, error) {
	err := pingDB(c, db)
	if err == nil {
		return false, nil
	}
	var pqErr *pq.Error
	if !errors.As(err, &pqErr) || pqErr.Code != "3D000" { // invalid_catalog_name
		return false, fmt.Errorf("connect: %w", err)
	}
	if c.Postgres.CreateDatabases != nil && !*c.Postgres.CreateDatabases {
		return false, fmt.Errorf("database %q does not exist and createDatabases is false", db)
	}
	admin, err := sql.Open("postgres", dsn(c, c.Postgres.AdminDatabase))
	if err != nil {
		return false, err
	}
	defer admin.Close()
	if _, err := admin.Exec("CREATE DATABASE " + pq.QuoteIdentifier(db)); err != nil {
		if errors.As(err, &pqErr) && pqErr.Code == "42P04" { // duplicate_database: a concurrent creator won
			return false, nil
		}
		return false, fmt.Errorf("create database (via %s): %w", c.Postgres.AdminDatabase, err)
	}
	return true, nil
}

func pingDB(c *HostConfig, db string) error {
	h, err := sql.Open("postgres", dsn(c, db))
	if err != nil {
		return err
	}
	defer h.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	return h.PingContext(ctx)
}

// dsn mirrors what Temporal's postgres12 plugin builds from the same config.SQL.
func dsn(c *HostConfig, db string) string {
	sc := c.sqlConfig(db, 1)
	q := url.Values{}
	for k, v := range sc.ConnectAttributes {
		q.Set(k, v)
	}
	u := url.URL{Scheme: "postgres", User: url.UserPassword(sc.User, sc.Password), Host: sc.ConnectAddr,
		Path: "/" + db, RawQuery: q.Encode()}
	return u.String()
}

// setupSqliteVisibility creates the SQLite schema (Temporal ships it unversioned) in a new file.
func setupSqliteVisibility(path string) (schemaResult, error) {
	res := schemaResult{Database: "sqlite:" + path, Expected: "unversioned"}
	if _, err := os.Stat(path); err == nil {
		res.To = "existing"
		return res, nil
	}
	cfg := (&HostConfig{Postgres: PostgresConfig{VisibilitySqliteFile: path}}).visibilitySQLConfig()
	if err := sqliteschema.SetupSchema(cfg); err != nil {
		return res, err
	}
	res.Created, res.To = true, "created"
	return res, nil
}
