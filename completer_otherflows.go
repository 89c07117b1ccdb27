package idem

import (
	"context"

	"github.com/go-idem/idem/idemdriver"
)

// warnOtherFlows logs, at warn, once per flow and pass, the running keys
// of flows this runner does not know (missing from Config.Flows): the
// completer never claims them, so a request of such a flow whose client
// does not retry stays unfinished, with whatever its committed phases did
// (a charge row pending), until the reaper deletes it (UnfinishedRetention).
// A store that cannot count them, or fails to, leaves the pass as it was.
func (r *Runner) warnOtherFlows(ctx context.Context) {
	counter, ok := r.store.(idemdriver.OtherFlowsCounter)
	if !ok {
		return
	}
	cctx, cancel := r.storeContext(ctx)
	groups, err := counter.RunningKeysOfOtherFlows(cctx, r.flowNames())
	cancel()
	if err != nil {
		r.log.DebugContext(ctx, "idem: completer could not count the keys of unknown flows", "err", err)
		return
	}
	for _, g := range groups {
		r.log.WarnContext(ctx, "idem: completer cannot finish keys of a flow this runner does not know; add the flow to idem.Config.Flows",
			"flow", g.Flow, "keys", g.Keys)
	}
}
