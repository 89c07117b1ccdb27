package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/go-idem/idem/internal/pgtest"
)

// The demo, serve processes killed with SIGKILL along the way, through
// PgBouncer in transaction pooling mode, in each exec mode that works
// there: every invariant holds, and the bouncer survives the kills.
func TestDemoThroughPgBouncer(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("runs the whole demo three times; skipped with -short")
	}
	for _, mode := range []string{"exec", "cache_describe", "simple_protocol"} {
		t.Run(mode, func(t *testing.T) {
			bounced := pgtest.NewBouncedSchema(t)
			ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
			defer cancel()
			var stdout, stderr bytes.Buffer
			cmd := command(ctx, []string{"demo", "--duration", "5s", "--kill-every", "1500ms", "--clients", "6", "--log-dir", t.TempDir()},
				"DATABASE_URL="+bounced.BouncedURL+"&default_query_exec_mode="+mode)
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			err := cmd.Run()
			out := stdout.String()
			require.NoError(t, err, "demo failed:\nstdout:\n%s\nstderr:\n%s", out, stderr.String())
			summary := requireHealthySummary(t, out)
			require.Positive(t, summary["server kills"], "the demo killed no server:\n%s", out)
			require.True(t, bounced.Bouncer.Alive(), "pgbouncer exited:\n%s", bounced.Bouncer.Log())
			t.Logf("demo through pgbouncer, %s:\n%s", mode, out[strings.Index(out, "server kills:"):])
		})
	}
}
