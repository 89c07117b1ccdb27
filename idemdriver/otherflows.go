package idemdriver

import "context"

// FlowKeys counts the unfinished keys of one flow.
type FlowKeys struct {
	Flow string `db:"flow"`
	Keys int    `db:"keys"`
}

// OtherFlowsCounter is what a store may implement so that the completer
// can name the flows it cannot finish: keys of a flow missing from the
// runner's Config.Flows are never claimed, and would otherwise wait,
// silently, until the reaper deletes them (UnfinishedRetention).
type OtherFlowsCounter interface {
	// RunningKeysOfOtherFlows counts, by flow, the keys in StoredRunning
	// of every flow not in known, reading only unfinished rows.
	RunningKeysOfOtherFlows(ctx context.Context, known []string) ([]FlowKeys, error)
}
