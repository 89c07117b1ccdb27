package pgstore

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/go-idem/idem/idemdriver"
	"github.com/go-idem/idem/internal/pgtest"
)

// A channel name fits the 63 bytes Postgres allows, and names its schema.
func TestChannel(t *testing.T) {
	t.Parallel()
	require.Equal(t, "idem_finished:billing", Channel("billing"))
	long := Channel(strings.Repeat("s", 63))
	require.LessOrEqual(t, len(long), 63)
	require.Equal(t, "idem_finished:", long[:14])
	require.NotEqual(t, long, Channel(strings.Repeat("s", 62)+"t"))
}

// A watch of a key that is gone wakes at once; Close stops the listener,
// and a second Close returns too.
func TestWatchAndCloseTwice(t *testing.T) {
	t.Parallel()
	schema := pgtest.NewMigratedSchema(t)
	st, err := New(schema.Pool, &Config{Schema: schema.Name})
	require.NoError(t, err)
	woken, stop := st.WatchKey(t.Context(), idemdriver.LockRef{ID: 999, Fence: 1})
	defer stop()
	select {
	case <-woken:
	case <-time.After(time.Minute):
		t.Fatal("the watch of a key that does not exist never woke")
	}
	st.Close()
	st.Close()
}
