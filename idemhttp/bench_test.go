package idemhttp

import (
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/go-idem/idem"
	"github.com/go-idem/idem/idemtype"
)

// discardWriter is a ResponseWriter that keeps nothing, so the benchmarks
// measure the encoding alone.
type discardWriter struct{ header http.Header }

func (w *discardWriter) Header() http.Header         { return w.header }
func (w *discardWriter) Write(p []byte) (int, error) { return len(p), nil }
func (w *discardWriter) WriteHeader(int)             {}

func benchHandler(profile Profile) *Handler[struct{}] {
	return &Handler[struct{}]{
		cfg:    Config[struct{}]{Profile: profile, ProblemTypeBase: ProblemTypeBaseDefault, MaxBodyBytes: MaxBodyBytesDefault},
		replay: []string{"Content-Type", "Location"},
		log:    slog.New(slog.NewTextHandler(io.Discard, nil)),
	}
}

// BenchmarkWriteOutcome measures writing what the runner decided: a replayed
// response and the problems a busy endpoint sends most.
func BenchmarkWriteOutcome(b *testing.B) {
	r := httptest.NewRequest(http.MethodPost, "/rides", nil)
	stored := &idemtype.Response{
		Status: http.StatusCreated,
		Header: http.Header{
			"Content-Type": {"application/json"},
			"Location":     {"/rides/123456"},
			"X-Request-Id": {"7c9e6679-7425-40de-944b-e07fc1f90ae7"},
		},
		Body: []byte(`{"ride_id":123456,"charge_id":"ch_1NirD82eZvKYlo2CIvbtLWuY","origin":"SFO","target":"OAK","amount":2000}`),
	}
	for _, bm := range []struct {
		name    string
		profile Profile
		write   func(h *Handler[struct{}], w http.ResponseWriter)
	}{
		{"Replay", ProfileIETF, func(h *Handler[struct{}], w http.ResponseWriter) { h.writeResponse(w, r, stored, true) }},
		{"ProblemInProgress/IETF", ProfileIETF, func(h *Handler[struct{}], w http.ResponseWriter) {
			h.writeOutcome(w, r, idem.Request{}, &idem.Outcome{Kind: idem.OutcomeInProgress, RetryAfter: 42 * time.Second}, idem.ErrInProgress)
		}},
		{"ProblemInProgress/Stripe", ProfileStripe, func(h *Handler[struct{}], w http.ResponseWriter) {
			h.writeOutcome(w, r, idem.Request{}, &idem.Outcome{Kind: idem.OutcomeInProgress, RetryAfter: 42 * time.Second}, idem.ErrInProgress)
		}},
		{"ProblemKeyReused/IETF", ProfileIETF, func(h *Handler[struct{}], w http.ResponseWriter) {
			h.writeOutcome(w, r, idem.Request{}, &idem.Outcome{Kind: idem.OutcomeMismatch}, idem.ErrMismatch)
		}},
		{"ProblemInvalidInput/IETF", ProfileIETF, func(h *Handler[struct{}], w http.ResponseWriter) {
			h.writeProblem(w, h.invalidInput(FieldError{Field: "origin_lat", Detail: "must be a number, not a string"}))
		}},
	} {
		b.Run(bm.name, func(b *testing.B) {
			h := benchHandler(bm.profile)
			w := &discardWriter{header: http.Header{}}
			b.ReportAllocs()
			for b.Loop() {
				clear(w.header)
				bm.write(h, w)
			}
		})
	}
}

// BenchmarkDecodeBody measures reading a rides request body into its input.
func BenchmarkDecodeBody(b *testing.B) {
	type rideInput struct {
		OriginLat float64 `json:"origin_lat"`
		OriginLon float64 `json:"origin_lon"`
		TargetLat float64 `json:"target_lat"`
		TargetLon float64 `json:"target_lon"`
	}
	h := &Handler[rideInput]{cfg: Config[rideInput]{ProblemTypeBase: ProblemTypeBaseDefault, MaxBodyBytes: MaxBodyBytesDefault}}
	body := []byte(`{"origin_lat": 37.6213, "origin_lon": -122.3790, "target_lat": 37.7749, "target_lon": -122.4194}`)
	b.ReportAllocs()
	for b.Loop() {
		if _, p := decodeBody(h, body); p != nil {
			b.Fatal(p)
		}
	}
}
