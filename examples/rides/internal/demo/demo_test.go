package demo

import (
	"net"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"
)

// A slot's port lies below the kernel's ephemeral range, so no outgoing
// connection takes it while the slot's process restarts, and it is free to
// listen on.
func TestFreePortIsBelowTheEphemeralRange(t *testing.T) {
	t.Parallel()
	low := ephemeralLow()
	for range 20 {
		port, err := freePort()
		require.NoError(t, err)
		require.Less(t, port, low)
		require.GreaterOrEqual(t, port, 10000)
		l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port))
		require.NoError(t, err)
		require.NoError(t, l.Close())
	}
}
