package idemotel_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/go-idem/idem"
	"github.com/go-idem/idem/idemotel"
	"github.com/go-idem/idem/internal/pgtest"
	"github.com/go-idem/idem/pgstore"
)

// What spans carry of an error (exception.message, the status, the events'
// error.message) is the text Config.RedactError gave it.
func TestSpansCarryRedactedErrors(t *testing.T) {
	t.Parallel()
	const card = "4111111111111111"
	schema := pgtest.NewMigratedSchema(t)
	store, err := pgstore.New(schema.Pool, &pgstore.Config{Schema: schema.Name})
	require.NoError(t, err)
	t.Cleanup(store.Close)
	spans := tracetest.NewSpanRecorder()
	obs, err := idemotel.New(&idemotel.Config{TracerProvider: sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))})
	require.NoError(t, err)
	flow := idem.MustNewFlow("payments.create", []idem.Phase[input]{{
		Name: "charged",
		Do: func(context.Context, idem.Tx, *idem.Attempt[input]) (idem.Result, error) {
			return idem.Result{}, errors.New("card " + card + " declined")
		},
	}}, nil)
	runner, err := idem.NewRunner(store, &idem.Config{
		Observer: obs, Flows: []idem.AnyFlow{flow}, Logger: slog.New(slog.DiscardHandler),
		RedactError: func(err error) string { return strings.ReplaceAll(err.Error(), card, "[card]") },
	})
	require.NoError(t, err)
	_, err = runner.Execute(context.Background(), flow, idem.Request{Scope: "user:1", Key: "k1", Params: input{}})
	require.ErrorIs(t, err, idem.ErrPhaseFailed)

	var texts []string
	for _, s := range spans.Ended() {
		texts = append(texts, s.Status().Description)
		for _, e := range s.Events() {
			for _, a := range e.Attributes {
				if a.Key == "exception.message" || a.Key == "error.message" {
					texts = append(texts, a.Value.AsString())
				}
			}
		}
	}
	all := strings.Join(texts, "\n")
	require.Contains(t, all, "card [card] declined")
	require.NotContains(t, all, card)
}
