package idemcli

import (
	"bytes"
	"context"
	"flag"
	"io"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/go-idem/idem"
)

func TestParseInterspersed(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct {
		args       []string
		positional []string
		scope      string
		json       bool
	}{
		"flags after":  {[]string{"k1", "--scope", "s", "--json"}, []string{"k1"}, "s", true},
		"flags before": {[]string{"--scope=s", "k1"}, []string{"k1"}, "s", false},
		"around":       {[]string{"-json", "k1", "-scope", "s", "k2"}, []string{"k1", "k2"}, "s", true},
		"terminator":   {[]string{"--scope", "s", "--", "--json"}, []string{"--json"}, "s", false},
		"none":         {nil, nil, "", false},
	} {
		fs := flag.NewFlagSet("t", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		scope := fs.String("scope", "", "")
		asJSON := fs.Bool("json", false, "")
		got, err := parseInterspersed(fs, tc.args)
		require.NoError(t, err, name)
		require.Equal(t, tc.positional, got, name)
		require.Equal(t, tc.scope, *scope, name)
		require.Equal(t, tc.json, *asJSON, name)
	}
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	_, err := parseInterspersed(fs, []string{"k1", "--nope"})
	require.ErrorContains(t, err, "flag provided but not defined")
}

// run runs the CLI in-process with an empty environment.
func run(t *testing.T, cfg *Config, args ...string) (string, string, int) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	c := Config{}
	if cfg != nil {
		c = *cfg
	}
	c.Stdout, c.Stderr, c.Getenv = &stdout, &stderr, func(string) string { return "" }
	code := Dispatch(context.Background(), args, &c)
	return stdout.String(), stderr.String(), code
}

func TestApplicationBuildNamesItselfAndItsFlows(t *testing.T) {
	t.Parallel()
	flow := idem.MustNewFlow("orders.create", []idem.Phase[struct{}]{{
		Name: "responded",
		Do: func(context.Context, idem.Tx, *idem.Attempt[struct{}]) (idem.Result, error) {
			return idem.RespondJSON(201, "ok"), nil
		},
	}}, nil)
	cfg := &Config{Name: "shopctl", Flows: []idem.AnyFlow{flow}}
	stdout, _, code := run(t, cfg, "--help")
	require.Equal(t, ExitOK, code)
	require.Contains(t, stdout, "shopctl operates")
	require.Contains(t, stdout, "Flows registered: orders.create")
	require.NotContains(t, stdout, "[not in this binary]")

	// With flows, complete gets as far as needing the database.
	_, stderr, code := run(t, cfg, "complete")
	require.Equal(t, ExitUsage, code)
	require.Contains(t, stderr, "shopctl: DATABASE_URL is not set")

	_, stderr, code = run(t, nil, "complete")
	require.Equal(t, ExitNoFlows, code)
	require.Contains(t, stderr, "idem: complete: this binary has no flows registered")

	stdout, _, code = run(t, cfg, "help", "keys")
	require.Equal(t, ExitOK, code)
	require.Contains(t, stdout, "shopctl keys list")
	require.Contains(t, stdout, "shopctl keys unlock")
}

func TestExitCodes(t *testing.T) {
	t.Parallel()
	require.Equal(t, ExitNotFound, exitCodeOf(idem.ErrNotFound))
	require.Equal(t, ExitUsage, exitCodeOf(idem.ErrInvalidRequest))
	require.Equal(t, ExitFailure, exitCodeOf(idem.ErrStoreUnavailable))
	// Every command's help renders and lists examples.
	for _, cmd := range commands {
		stdout, stderr, code := run(t, nil, append([]string{"help"}, strings.Fields(cmd.name)...)...)
		require.Equal(t, ExitOK, code, cmd.name)
		require.Empty(t, stderr, cmd.name)
		require.Contains(t, stdout, "Examples:", cmd.name)
		require.NotEmpty(t, cmd.examples, cmd.name)
	}
}

func TestPrintable(t *testing.T) {
	t.Parallel()
	require.Equal(t, `{"ok":true}`, printable([]byte(`{"ok":true}`)))
	require.Equal(t, "(empty)", printable(nil))
	require.Equal(t, "(3 bytes, base64) AAEC", printable([]byte{0, 1, 2}))
}

// Help examples name the program that prints them, for every command: an
// application's CLI shows its own name, never another's.
func TestHelpExamplesUseTheProgramsName(t *testing.T) {
	t.Parallel()
	for _, name := range []string{"", "shopctl"} {
		want := name
		if want == "" {
			want = "idem"
		}
		for _, cmd := range commands {
			stdout, _, code := run(t, &Config{Name: name}, append([]string{"help"}, strings.Fields(cmd.name)...)...)
			require.Equal(t, ExitOK, code, cmd.name)
			_, examples, ok := strings.Cut(stdout, "Examples:\n")
			require.True(t, ok, cmd.name)
			for _, line := range strings.Split(strings.TrimSpace(examples), "\n") {
				require.Contains(t, " "+strings.TrimSpace(line), " "+want+" "+cmd.name, "%s: %q", want, line)
				require.NotContains(t, line, "ridesctl")
			}
		}
	}
}
