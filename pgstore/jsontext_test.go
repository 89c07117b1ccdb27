package pgstore

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"
)

// The hand-written JSON of a checkpoint patch and a response header decodes
// to what encoding/json's would, names and values with quotes,
// backslashes, control characters, non-ASCII and invalid UTF-8 included.
func TestPatchAndHeaderJSONMatchEncodingJSON(t *testing.T) {
	t.Parallel()
	odd := []string{"", "plain", `quo"te`, `back\slash`, "tab\tnew\nline\x01", "Ünïcode ✓", "bad\xffutf8", "<script>&"}
	patch := map[string]json.RawMessage{}
	header := map[string][]string{"Nil": nil, "Empty": {}}
	for i, s := range odd {
		v, err := json.Marshal(map[string]any{"s": s, "n": i})
		require.NoError(t, err)
		patch[s] = v
		header[s] = []string{s, "x"}
	}
	for _, c := range []struct {
		got  []byte
		want any
	}{
		{appendPatch(nil, patch), patch},
		{appendPatch(nil, nil), map[string]json.RawMessage{}},
		{appendHeader(nil, header), header},
		{appendHeader(nil, map[string][]string{}), map[string][]string{}},
	} {
		want, err := json.Marshal(c.want)
		require.NoError(t, err)
		require.True(t, json.Valid(c.got), "%s", c.got)
		var gotV, wantV any
		require.NoError(t, json.Unmarshal(c.got, &gotV))
		require.NoError(t, json.Unmarshal(want, &wantV))
		require.Equal(t, wantV, gotV)
	}
}
