package idemhttp_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"mime"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/go-idem/idem/idemhttp"
	"github.com/go-idem/idem/idemtype"
)

// FuzzHandlerBody posts arbitrary bytes, with an arbitrary Content-Type, to
// the rides handler against Postgres. The handler never panics and never
// answers 5xx for bad input; it answers 201 exactly when a reference decoder
// (plain encoding/json) accepts the body and the input validates, and a key
// row exists exactly then.
func FuzzHandlerBody(f *testing.F) {
	for _, seed := range []struct{ body, contentType string }{
		{rideBody, "application/json"},
		{`{"origin":"SFO","amount":20,"user_id":"mallory"}`, "application/json"},
		{`{"origin":"S\u0000FO","amount":1}`, "application/json"},
		{`{"origin":"\ud800","amount":1}`, "application/json; charset=utf-8"},
		{`{"origin":"SFO","amount":"20"}`, "application/json"},
		{`{"origin":"SFO","amount":1e400}`, ""},
		{`{"origin":"SFO","amount":20} x`, "application/json"},
		{`[{"origin":"SFO"}]`, "application/merge-patch+json"},
		{`null`, "application/json"},
		{"", "application/json"},
		{`{"origin":"SFO","amount":20}`, "text/plain"},
		{`{"origin":"SFO","amount":20}`, "application/json; charset=latin1"},
		{"{\"origin\":\"\xff\",\"amount\":2}", "application/json"},
	} {
		f.Add([]byte(seed.body), seed.contentType)
	}

	b := setup(f, idemhttp.ProfileIETF)
	h := b.handler(f, func(c *idemhttp.Config[rideInput]) { c.MaxBodyBytes = 4096 })
	var seq atomic.Int64

	f.Fuzz(func(t *testing.T, body []byte, contentType string) {
		key := "fuzz-" + strconv.FormatInt(seq.Add(1), 10)
		r := httptest.NewRequest(http.MethodPost, "/rides", bytes.NewReader(body))
		r.Header.Set("Authorization", testAuth)
		r.Header.Set("Idempotency-Key", key)
		if contentType != "" {
			r.Header["Content-Type"] = []string{contentType}
		}
		res := serve(h, r)
		row := b.keyRow(t, key)

		if res.Code == http.StatusCreated {
			require.True(t, referenceAccepts(body, contentType), "accepted %q (%q)", body, contentType)
			require.NotNil(t, row)
			require.Equal(t, idemtype.StoredFinished, row.Status)
			require.Equal(t, res.Body.Bytes(), row.ResponseBody)
			var params rideInput
			require.NoError(t, json.Unmarshal(row.Params, &params))
			require.Equal(t, "alice", params.UserID, "a client cannot set a server-derived field")
			return
		}
		require.Nil(t, row, "%d for %q, yet a key was written", res.Code, body)
		require.Contains(t, []int{http.StatusBadRequest, http.StatusRequestEntityTooLarge, http.StatusUnsupportedMediaType,
			http.StatusUnprocessableEntity}, res.Code, "%q (%q): %s", body, contentType, res.Body)
		require.False(t, referenceAccepts(body, contentType), "refused %q (%q): %s", body, contentType, res.Body)
		p := decodeProblem(t, res)
		require.Equal(t, res.Code, p.Status)
	})
}

// referenceAccepts is the contract stated independently: a JSON (or
// unspecified) media type in UTF-8, one JSON object that decodes into
// rideInput without unknown members, no NUL in the strings it keeps (Prepare overwrites user_id), and the
// validation rules of the test configuration.
func referenceAccepts(body []byte, contentType string) bool {
	if len(body) > 4096 {
		return false
	}
	if contentType != "" {
		mediaType, params, err := mime.ParseMediaType(contentType)
		if err != nil || (mediaType != "application/json" && !strings.HasSuffix(mediaType, "+json")) {
			return false
		}
		if cs, ok := params["charset"]; ok && !strings.EqualFold(cs, "utf-8") {
			return false
		}
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	var raw json.RawMessage
	if err := dec.Decode(&raw); err != nil || bytes.Equal(raw, []byte("null")) {
		return false
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return false
	}
	var in rideInput
	strict := json.NewDecoder(bytes.NewReader(raw))
	strict.DisallowUnknownFields()
	if strict.Decode(&in) != nil {
		return false
	}
	return in.Origin != "" && in.Amount > 0 && !strings.ContainsRune(in.Origin, 0)
}
