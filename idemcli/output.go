package idemcli

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"sort"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/go-idem/idem"
	"github.com/go-idem/idem/migrations"
)

func (e *env) printJSON(v any) error {
	enc := json.NewEncoder(e.out)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func (e *env) table() *tabwriter.Writer {
	return tabwriter.NewWriter(e.out, 0, 4, 2, ' ', 0)
}

func (e *env) printMigration(res *migrations.Result) error {
	if e.json {
		applied := res.Applied
		if applied == nil {
			applied = []int{}
		}
		return e.printJSON(map[string]any{"from": res.From, "to": res.To, "applied": applied})
	}
	if len(res.Applied) == 0 {
		_, err := fmt.Fprintf(e.out, "nothing to do: the schema is at version %d\n", res.To)
		return err
	}
	verbs := make([]string, len(res.Applied))
	for i, v := range res.Applied {
		verbs[i] = fmt.Sprintf("%04d", v)
	}
	what := "applied"
	if res.To < res.From {
		what = "reverted"
	}
	_, err := fmt.Fprintf(e.out, "%s %s: the schema went from version %d to %d\n", what, strings.Join(verbs, ", "), res.From, res.To)
	return err
}

func (e *env) printMigrationStatus(current int) error {
	type row struct {
		Version int    `json:"version"`
		Name    string `json:"name"`
		Applied bool   `json:"applied"`
	}
	var rows []row
	pending := 0
	for _, m := range migrations.All() {
		rows = append(rows, row{m.Version, m.Name, m.Version <= current})
		if m.Version > current {
			pending++
		}
	}
	if e.json {
		return e.printJSON(map[string]any{"current": current, "latest": migrations.Latest(), "pending": pending, "migrations": rows})
	}
	tw := e.table()
	fmt.Fprintln(tw, "VERSION\tNAME\tSTATE")
	for _, r := range rows {
		state := "pending"
		if r.Applied {
			state = "applied"
		}
		fmt.Fprintf(tw, "%04d\t%s\t%s\n", r.Version, r.Name, state)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	switch {
	case current > migrations.Latest():
		_, err := fmt.Fprintf(e.out, "\nthe schema is at version %d, ahead of this binary (latest %d): upgrade the binary\n", current, migrations.Latest())
		return err
	case pending > 0:
		_, err := fmt.Fprintf(e.out, "\nversion %d of %d: %d pending; run `%s migrate up`\n", current, migrations.Latest(), pending, e.cfg.Name)
		return err
	}
	_, err := fmt.Fprintf(e.out, "\nversion %d: up to date\n", current)
	return err
}

// keyJSON is a key as the JSON output shows it: the record's fields plus its
// state.
type keyJSON struct {
	*idem.KeyRecord
	State idem.KeyState `json:"state"`
}

func (e *env) printKeyList(list *idem.KeyList) error {
	if e.json {
		keys := make([]keyJSON, len(list.Keys))
		for i, k := range list.Keys {
			keys[i] = keyJSON{k, k.State(list.Now)}
		}
		return e.printJSON(map[string]any{"now": list.Now, "keys": keys})
	}
	if len(list.Keys) == 0 {
		_, err := fmt.Fprintln(e.out, "no keys match")
		return err
	}
	tw := e.table()
	fmt.Fprintln(tw, "ID\tSCOPE\tKEY\tFLOW\tSTATE\tRECOVERY POINT\tATTEMPTS\tLAST RUN\tEXPIRES")
	for _, k := range list.Keys {
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\n", k.ID, k.Scope, k.Key, k.Flow, k.State(list.Now),
			k.RecoveryPoint, k.Attempts, ago(k.LastRunAt, list.Now), timeOrDash(k.ExpiresAt))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(list.Keys) > 1 {
		_, err := fmt.Fprintf(e.out, "%d keys; older ones: --before-id %d\n", len(list.Keys), list.Keys[len(list.Keys)-1].ID)
		return err
	}
	return nil
}

func (e *env) printKey(k *idem.KeyRecord, now time.Time) error {
	if e.json {
		return e.printJSON(keyJSON{k, k.State(now)})
	}
	tw := e.table()
	field := func(name, value string) { fmt.Fprintf(tw, "%s\t%s\n", name, value) }
	field("key", k.Key)
	field("scope", k.Scope)
	field("flow", k.Flow)
	field("state", string(k.State(now)))
	field("status", string(k.Status))
	field("recovery point", k.RecoveryPoint)
	field("request", strings.TrimSpace(k.Method+" "+k.Path))
	field("request id", k.RequestID)
	field("id", fmt.Sprint(k.ID))
	field("fence", fmt.Sprint(k.Fence))
	field("attempts", fmt.Sprint(k.Attempts))
	field("locked at", timeOrDash(k.LockedAt))
	lease := timeOrDash(k.LeaseExpiresAt)
	if k.LeaseExpiresAt != nil {
		if k.LeaseExpiresAt.After(now) {
			lease += " (live)"
		} else {
			lease += " (expired)"
		}
	}
	field("lease expires", lease)
	field("created at", k.CreatedAt.UTC().Format(time.RFC3339))
	field("last run at", k.LastRunAt.UTC().Format(time.RFC3339)+" ("+ago(k.LastRunAt, now)+")")
	field("finished at", timeOrDash(k.FinishedAt))
	field("expires at", timeOrDash(k.ExpiresAt))
	field("foreign mark", orDash(k.ForeignMark))
	field("last error", orDash(k.LastError))
	field("params", string(k.Params))
	checkpoint, _ := json.Marshal(k.Checkpoint)
	field("checkpoint", string(checkpoint))
	if k.Status == idem.StatusFinished {
		field("response status", fmt.Sprintf("%d %s", k.ResponseStatus, http.StatusText(k.ResponseStatus)))
		field("response headers", headerLine(k.ResponseHeaders))
		field("response body", printable(k.ResponseBody))
	}
	return tw.Flush()
}

func (e *env) printUnlock(res *idem.UnlockResult) error {
	if e.json {
		// The statement's result has no clock; an unlocked key is stale and
		// a key left alone is finished or expired, which its expiry says.
		now := time.Now()
		return e.printJSON(map[string]any{"unlocked": res.Unlocked, "key": keyJSON{res.Record, res.Record.State(now)}})
	}
	k := res.Record
	if !res.Unlocked {
		_, err := fmt.Fprintf(e.out, "nothing to unlock: key %q (scope %q) is finished\n", k.Key, k.Scope)
		return err
	}
	next := "the next attempt resumes after " + k.RecoveryPoint
	if k.RecoveryPoint == idem.RecoveryPointStarted {
		next = "the next attempt starts it from its first phase"
	}
	if k.Status == idem.StatusNeedsReconcile {
		next = "it still needs reconciliation"
	} else if k.ForeignMark != "" {
		next = "its foreign call in " + k.ForeignMark + " is in doubt: the next attempt sends it to reconcile"
	}
	_, err := fmt.Fprintf(e.out, "unlocked key %q (scope %q): fence is now %d, so its previous holder cannot commit; %s\n",
		k.Key, k.Scope, k.Fence, next)
	return err
}

func (e *env) printReap(res *idem.ReapResult) error {
	if e.json {
		return e.printJSON(res)
	}
	_, err := fmt.Fprintf(e.out, "reaped %d expired key(s) in %d batch(es)\n", res.Deleted, res.Batches)
	return err
}

func (e *env) printComplete(res *idem.CompleteResult) error {
	if e.json {
		return e.printJSON(res)
	}
	_, err := fmt.Fprintf(e.out, "claimed %d idle key(s): %d completed, %d skipped (a client got there first), %d need reconciliation, %d failed\n",
		res.Claimed, res.Completed, res.Skipped, res.NeedsReconcile, res.Failed)
	return err
}

func (e *env) printReconcile(res *idem.ReconcileResult) error {
	if e.json {
		return e.printJSON(res)
	}
	_, err := fmt.Fprintf(e.out, "claimed %d needs_reconcile key(s): %d resolved, %d still unresolved, %d skipped, %d failed after the verdict\n",
		res.Claimed, res.Resolved, res.Unresolved, res.Skipped, res.Failed)
	return err
}

func (e *env) printReconcileOne(out *idem.Outcome, summary string, err error) error {
	var perr error
	if e.json {
		v := map[string]any{"outcome": out.Kind, "summary": summary}
		if out.Record != nil {
			v["key"] = keyJSON{out.Record, out.Record.State(time.Now())}
		}
		perr = e.printJSON(v)
	} else {
		key := ""
		if out.Record != nil {
			key = fmt.Sprintf("key %q (scope %q): ", out.Record.Key, out.Record.Scope)
		}
		_, perr = fmt.Fprintf(e.out, "%s%s\n", key, summary)
	}
	if err != nil {
		return err
	}
	return perr
}

func ago(t, now time.Time) string {
	d := now.Sub(t).Round(time.Second)
	if d < 0 {
		return "in " + (-d).String()
	}
	return d.String() + " ago"
}

func timeOrDash(t *time.Time) string {
	if t == nil {
		return "-"
	}
	return t.UTC().Format(time.RFC3339)
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func headerLine(h http.Header) string {
	if len(h) == 0 {
		return "-"
	}
	names := make([]string, 0, len(h))
	for n := range h {
		names = append(names, n)
	}
	sort.Strings(names)
	parts := make([]string, 0, len(names))
	for _, n := range names {
		parts = append(parts, n+": "+strings.Join(h[n], ", "))
	}
	return strings.Join(parts, "; ")
}

// printable shows a body as text when it is printable UTF-8 and as base64
// otherwise, so a binary body cannot garble the terminal.
func printable(b []byte) string {
	if len(b) == 0 {
		return "(empty)"
	}
	if utf8.Valid(b) && strings.IndexFunc(string(b), func(r rune) bool { return !unicode.IsPrint(r) && !unicode.IsSpace(r) }) < 0 {
		return string(b)
	}
	return fmt.Sprintf("(%d bytes, base64) %s", len(b), base64.StdEncoding.EncodeToString(b))
}
