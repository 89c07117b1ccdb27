package main

import (
	"strings"
	"testing"

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
			t.Cleanup(func() {
				if t.Failed() {
					// Whether the bouncer itself went away, and what it said.
					t.Logf("pgbouncer alive: %v; its log:\n%s", bounced.Bouncer.Alive(), bounced.Bouncer.Log())
				}
			})
			out, _ := runDemoWithKills(t, "5s", "DATABASE_URL="+bounced.BouncedURL+"&default_query_exec_mode="+mode)
			require.True(t, bounced.Bouncer.Alive(), "pgbouncer exited:\n%s", bounced.Bouncer.Log())
			// A LISTEN through the pooler stays on a server connection that
			// others then use, and the bouncer warns of each notification
			// that arrives on it while no client is linked.
			for line := range strings.Lines(bounced.Bouncer.Log()) {
				require.False(t, strings.Contains(line, bounced.Name) && strings.Contains(line, "when not linked"),
					"a LISTEN went through the pooler: %s", line)
			}
			t.Logf("demo through pgbouncer, %s:\n%s", mode, out[strings.Index(out, "server kills:"):])
		})
	}
}
