package pgtest

import (
	"os/exec"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// fakeDockerHelper starts a shell script in place of pgdocker, to check the helper protocol on a
// machine without Docker.
func fakeDockerHelper(t *testing.T, script string) *dockerHelper {
	t.Helper()
	if runtime.GOOS == "windows" {
		t.Skip("the fake helper is a shell script")
	}
	sh, err := exec.LookPath("sh")
	require.NoError(t, err)
	h, err := startDockerHelper(t.TempDir(), sh, []string{"-c", script})
	require.NoError(t, err)
	return h
}

func firstLine(t *testing.T, h *dockerHelper) (string, bool) {
	t.Helper()
	select {
	case line, ok := <-h.first:
		return line, ok
	case <-time.After(30 * time.Second):
		t.Fatal("no first line from the helper")
		return "", false
	}
}

// The container lives until stop closes the helper's stdin; stop waits for the helper to finish.
func TestDockerHelperStopsOnEndOfStdin(t *testing.T) {
	t.Parallel()
	h := fakeDockerHelper(t, `echo started 127.0.0.1:5999; cat >/dev/null; echo removed >&2`)
	line, ok := firstLine(t, h)
	require.True(t, ok)
	require.Equal(t, "started 127.0.0.1:5999", line)
	select {
	case <-h.done:
		t.Fatal("the helper exited before its stdin was closed")
	case <-time.After(100 * time.Millisecond):
	}
	require.NoError(t, h.stop())
	require.Equal(t, "removed\n", h.stderr.String())
	require.NoError(t, h.stop(), "stop is safe to call twice")
}

// A container that stops on its own closes exited, which ends waitReady early.
func TestDockerHelperReportsAnExitedContainer(t *testing.T) {
	t.Parallel()
	h := fakeDockerHelper(t, `echo started 127.0.0.1:5999; echo exited`)
	_, ok := firstLine(t, h)
	require.True(t, ok)
	select {
	case <-h.exited:
	case <-time.After(30 * time.Second):
		t.Fatal("exited was not closed")
	}
	require.NoError(t, h.stop())
}

// A helper that fails before its first line (say, it does not build) fails with what it printed.
func TestDockerHelperFailureCarriesItsMessage(t *testing.T) {
	t.Parallel()
	h := fakeDockerHelper(t, `echo 'main.go:1: syntax error' >&2; exit 1`)
	_, ok := firstLine(t, h)
	require.False(t, ok)
	err := h.stop()
	require.ErrorContains(t, err, "exit status 1")
	require.ErrorContains(t, err, "main.go:1: syntax error")
}

// The helper's source is found beside this package's, whatever the working directory.
func TestDockerHelperSource(t *testing.T) {
	t.Parallel()
	dir, err := dockerHelperSource()
	require.NoError(t, err)
	require.FileExists(t, dir+"/main.go")
}
