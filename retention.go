package idem

import "time"

// Retention is how long the runner keeps and replays a finished key of flow
// before the reaper may delete it: the flow's FlowConfig.Retention, else
// Config.Retention. A key older than that is a new request, so an adapter
// whose clients retry for a known time (a webhook provider's redelivery
// window) checks it against this.
func (r *Runner) Retention(flow AnyFlow) time.Duration {
	return flow.retentionOr(r.config.Retention)
}

// UnfinishedRetention is how long after its creation an unfinished key of flow is
// deleted, so that the request runs anew from its first phase:
// the flow's FlowConfig.UnfinishedRetention, else Config.UnfinishedRetention. Negative:
// never.
func (r *Runner) UnfinishedRetention(flow AnyFlow) time.Duration {
	return flow.abandonAfterOr(r.config.UnfinishedRetention)
}
