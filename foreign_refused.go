package idem

import (
	"context"

	"github.com/go-idem/idem/internal/hooks"
)

// refuse hands the test hook a foreign call the runner refused, so that a
// phase which swallows the refusal cannot hide the lost effect from a test,
// and returns what Attempt.Foreign returns: the refusal, or the hook's error.
func (h *held) refuse(ctx context.Context, name string, refusal error) error {
	if herr := h.runner.hookAt(ctx, h, hooks.Point{Where: hooks.ForeignRefused, Foreign: name, Err: refusal}); herr != nil {
		return herr
	}
	return refusal
}
