package idemhttp

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/go-idem/idem"
)

// An outcome the caller cancelled answers 499 without a body and without a
// problem: the client is gone, nothing was stored, and its retry resumes.
func TestCanceledOutcomeAnswers499(t *testing.T) {
	t.Parallel()
	h := benchHandler(ProfileIETF)
	w := httptest.NewRecorder()
	r := httptest.NewRequest(http.MethodPost, "/rides", nil)
	h.writeOutcome(w, r, idem.Request{Key: "k"}, &idem.Outcome{Kind: idem.OutcomeCanceled}, fmt.Errorf("acquire: %w", context.Canceled))
	require.Equal(t, StatusClientClosedRequest, w.Code)
	require.Empty(t, w.Body.Bytes())
	require.Empty(t, w.Header().Get("Content-Type"))
}
