package idem

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/go-idem/idem/internal/canonical"
	"github.com/stretchr/testify/require"
)

// Re-encoding the input must not multiply its size: encoding/json's default
// HTML escaping writes each '<', '>' and '&' as six bytes, so a 1 MiB body
// of '<' became 6 MiB in memory while it was fingerprinted and stored.
func TestPrepareDoesNotEscapeHTML(t *testing.T) {
	t.Parallel()
	type input struct {
		Note string `json:"note"`
	}
	flow := MustNewFlow("notes.create", []Phase[input]{{
		Name: "noted",
		Do: func(context.Context, Tx, *Attempt[input]) (Result, error) {
			return RespondJSON(201, "ok"), nil
		},
	}}, nil)
	note := strings.Repeat("<", 1<<20) + "&>"
	p, err := flow.prepare(&Request{Params: input{Note: note}}, nil)
	require.NoError(t, err)
	require.Less(t, len(p.params), 1<<20+64, "the stored input is as long as the input, not six times longer")
	require.True(t, bytes.HasPrefix(p.params, []byte(`{"note":"<<<`)), "written literally")
	require.True(t, bytes.HasSuffix(p.params, []byte(`&>"}`)), "no trailing newline")

	// The fingerprint is the canonical form's, which never escaped them:
	// keys fingerprinted before this change still match.
	escaped := []byte(`{"note":"` + strings.ReplaceAll(note, "<", `\u003c`) + `"}`)
	fp, err := fingerprintOf("notes.create", escaped)
	require.NoError(t, err)
	require.Equal(t, [][]byte{fp}, p.fingerprints)

	// The canonicaliser writes them literally too, whichever way they came.
	canon, err := canonical.JSON([]byte(`"\u003c\u003e\u0026` + note + `"`))
	require.NoError(t, err)
	require.Equal(t, `"<>&`+note+`"`, string(canon))

	// A NUL is still refused, and a stored input decodes back.
	_, err = flow.prepare(&Request{Params: input{Note: "a\x00b"}}, nil)
	require.ErrorIs(t, err, ErrInvalidParams)
	p, err = flow.prepare(&Request{Params: []byte(`{"note": "\u003c&"}`)}, nil)
	require.NoError(t, err)
	require.Equal(t, `{"note":"<&"}`, string(p.params))
}
