package idemtest_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/go-idem/idem/idemtest"
	"github.com/go-idem/idem/idemtype"
)

func TestEqualStatusAndBody(t *testing.T) {
	t.Parallel()
	base := &idemtype.Response{Status: 201, Body: []byte(`{"id":1}`)}
	require.NoError(t, idemtest.EqualStatusAndBody(base, &idemtype.Response{Status: 201, Body: []byte(`{"id":1}`)}))
	require.EqualError(t, idemtest.EqualStatusAndBody(base, &idemtype.Response{Status: 500, Body: []byte(`oops`)}),
		`status 500, want 201; body "oops"`)
	require.EqualError(t, idemtest.EqualStatusAndBody(base, &idemtype.Response{Status: 201, Body: []byte(`{"id": 1}`)}),
		`body "{\"id\": 1}", want "{\"id\":1}"`)
}

func TestEqualJSONIgnoresNamedFieldsAtAnyDepth(t *testing.T) {
	t.Parallel()
	cmp := idemtest.EqualJSON("id", "created")
	base := &idemtype.Response{Status: 201, Body: []byte(`{"id": 1, "item": "book", "lines": [{"id": 7, "qty": 2}], "meta": {"created": "x"}}`)}

	same := &idemtype.Response{Status: 201, Body: []byte(`{"meta":{"created":"y"},"lines":[{"qty":2,"id":9}],"item":"book","id":2}`)}
	require.NoError(t, cmp(base, same))

	other := &idemtype.Response{Status: 201, Body: []byte(`{"id": 2, "item": "pen", "lines": [{"id": 9, "qty": 2}], "meta": {}}`)}
	require.EqualError(t, cmp(base, other),
		`body {"item":"pen","lines":[{"qty":2}],"meta":{}}, want {"item":"book","lines":[{"qty":2}],"meta":{}} (ignoring id, created)`)

	require.ErrorContains(t, cmp(base, &idemtype.Response{Status: 409, Body: base.Body}), "status 409, want 201")
	require.ErrorContains(t, cmp(base, &idemtype.Response{Status: 201, Body: []byte(`not json`)}), "is not JSON")
	require.ErrorContains(t, cmp(base, &idemtype.Response{Status: 201, Body: []byte(`{} {}`)}), "trailing data")
	require.ErrorContains(t, cmp(base, nil), "missing response")

	// Numbers compare exactly, not as floats.
	big := idemtest.EqualJSON()
	require.Error(t, big(&idemtype.Response{Status: 200, Body: []byte(`{"n": 9007199254740993}`)}, &idemtype.Response{Status: 200, Body: []byte(`{"n": 9007199254740992}`)}))
}
