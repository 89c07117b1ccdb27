package idemcli

import (
	"bytes"
	"cmp"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/go-idem/idem"
	"github.com/go-idem/idem/idemtype"
	"github.com/go-idem/idem/migrations"
)

func (e *env) printJSON(v any) error {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		return err
	}
	_, err := e.out.Write(escapeJSONText(buf.Bytes()))
	return err
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
		out := map[string]any{"from": res.From, "to": res.To, "applied": applied}
		if res.Distributed {
			out["distributed"] = true
		}
		return e.printJSON(out)
	}
	distributed := ""
	if res.Distributed {
		distributed = "; idem's tables are now distributed by scope (Citus)"
	}
	if len(res.Applied) == 0 {
		_, err := fmt.Fprintf(e.out, "nothing to do: the schema is at version %d%s\n", res.To, distributed)
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
	_, err := fmt.Fprintf(e.out, "%s %s: the schema went from version %d to %d%s\n", what, strings.Join(verbs, ", "), res.From, res.To, distributed)
	return err
}

// printMigrationStatus prints the schema's state.
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
		_, err := fmt.Fprintf(e.out, "\nthe schema is at version %d, ahead of this binary (latest %d): migrate it with a binary that knows its versions\n", current, migrations.Latest())
		return err
	case pending > 0:
		_, err := fmt.Fprintf(e.out, "\nversion %d of %d: %d pending; run `%s migrate up`\n", current, migrations.Latest(), pending, e.cfg.Name)
		return err
	}
	_, err := fmt.Fprintf(e.out, "\nversion %d: up to date\n", current)
	return err
}

// keyJSON is a key as the JSON output shows it: the record's metadata plus
// its state, and its payload (params, checkpoint data, stored response,
// fingerprints) only
// when revealed. The payload fields shadow the record's, so an unrevealed
// key's are left out rather than shown empty.
type keyJSON struct {
	*idemtype.KeyRecord
	State           idemtype.KeyState          `json:"state"`
	Params          json.RawMessage            `json:"params,omitempty"`
	Checkpoint      map[string]json.RawMessage `json:"checkpoint,omitempty"`
	ResponseHeaders http.Header                `json:"response_headers,omitempty"`
	ResponseBody    []byte                     `json:"response_body,omitempty"`
	// Fingerprint is shown only when revealed: without a fingerprint key
	// it is a plain SHA-256 over what the client sent, which a guess at a
	// small payload (an amount) can be checked against.
	Fingerprint []byte `json:"fingerprint,omitempty"`
	// Verdicts are the operators' verdicts on the key (keys show only).
	Verdicts []idemtype.Verdict `json:"verdicts,omitempty"`
}

func newKeyJSON(k *idemtype.KeyRecord, now time.Time, reveal bool) keyJSON {
	j := keyJSON{KeyRecord: k, State: k.State(now)}
	if reveal {
		j.Params, j.Checkpoint, j.ResponseHeaders, j.ResponseBody = k.Params, k.Checkpoint, k.ResponseHeaders, k.ResponseBody
		j.Fingerprint = k.Fingerprint
	}
	return j
}

// printKeyList prints a page of keys; more says older keys exist beyond it.
func (e *env) printKeyList(list *idemtype.KeyList, reveal, more bool) error {
	if e.json {
		keys := make([]keyJSON, len(list.Keys))
		for i, k := range list.Keys {
			keys[i] = newKeyJSON(k, list.Now, reveal)
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
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\n", k.ID, safe(k.Scope), safe(k.Key), safe(k.Flow), k.State(list.Now),
			safe(k.RecoveryPoint), k.Attempts, ago(k.LastRunAt, list.Now), timeOrDash(k.ExpiresAt))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if more {
		_, err := fmt.Fprintf(e.out, "%d keys; older ones: --before-id %d\n", len(list.Keys), list.Keys[len(list.Keys)-1].ID)
		return err
	}
	return nil
}

func (e *env) printKey(k *idemtype.KeyRecord, now time.Time, reveal bool, verdicts []idemtype.Verdict) error {
	if e.json {
		j := newKeyJSON(k, now, reveal)
		j.Verdicts = verdicts
		return e.printJSON(j)
	}
	tw := e.table()
	// Every value is escaped: it comes from the database, where a client
	// (or anyone who can write the table) may have put terminal escapes.
	field := func(name, value string) { fmt.Fprintf(tw, "%s\t%s\n", name, safe(value)) }
	field("key", k.Key)
	field("scope", k.Scope)
	field("flow", k.Flow)
	field("state", string(k.State(now)))
	field("status", string(k.Status))
	field("recovery point", k.RecoveryPoint)
	field("request", strings.TrimSpace(k.Method+" "+k.Path))
	field("id", fmt.Sprint(k.ID))
	field("fence", fmt.Sprint(k.Fence))
	field("attempts", fmt.Sprint(k.Attempts))
	field("locked at", timeOrDash(k.LockedAt))
	lease := timeOrDash(k.LeaseExpiresAt)
	if k.LeaseExpiresAt != nil {
		if k.LeaseExpiresAt.After(now) {
			// A lease stays live for its whole term after its holder died:
			// the database cannot tell.
			lease += " (live: the holder's heartbeats renew it; if the holder died, it runs out then)"
		} else {
			lease += " (expired)"
		}
	}
	field("lease expires", lease)
	field("holder", holderLine(k))
	field("created at", k.CreatedAt.UTC().Format(time.RFC3339))
	field("last run at", k.LastRunAt.UTC().Format(time.RFC3339)+" ("+ago(k.LastRunAt, now)+")")
	field("finished at", timeOrDash(k.FinishedAt))
	field("expires at", timeOrDash(k.ExpiresAt))
	field("foreign mark", orDash(k.ForeignMark))
	field("last error", orDash(k.LastError))
	field("sealed at rest", sealedWith(k))
	if k.Status == idemtype.StoredFinished {
		field("response status", fmt.Sprintf("%d %s", k.ResponseStatus, http.StatusText(k.ResponseStatus)))
	}
	if err := e.verdictLines(tw, verdicts); err != nil {
		return err
	}
	if !reveal {
		fmt.Fprintf(tw, "%s\t%s\n", "payload", "hidden: params, checkpoint data, the stored response and the fingerprints (--reveal shows them)")
		return tw.Flush()
	}
	field("params", string(escapeJSONText(k.Params)))
	checkpoint, _ := json.Marshal(k.Checkpoint)
	field("checkpoint", string(escapeJSONText(checkpoint)))
	if k.Status == idemtype.StoredFinished {
		field("response headers", headerLine(k.ResponseHeaders))
		// printable escapes what it must itself (or shows base64).
		fmt.Fprintf(tw, "%s\t%s\n", "response body", printable(k.ResponseBody))
	}
	return tw.Flush()
}

// verdictLines adds a line per operator verdict to a key's table.
func (e *env) verdictLines(tw io.Writer, verdicts []idemtype.Verdict) error {
	if len(verdicts) == 0 {
		_, err := fmt.Fprintf(tw, "%s\t%s\n", "verdicts", "-")
		return err
	}
	for i, v := range verdicts {
		line := fmt.Sprintf("%s by %s at %s: %s (phase %s%s, fence %d, generation %d, key id %d; database role %s from %s): %s",
			v.Verdict, v.Operator, v.CreatedAt.UTC().Format(time.RFC3339), v.Reason, orDash(v.Phase), kindNote(v.ForeignKind),
			v.Fence, v.Generation, v.KeyID, v.SessionUser, cmp.Or(v.ClientAddr, "a local socket"), v.Action)
		if v.AnswerStatus != nil {
			line += fmt.Sprintf("; answer: status %d, %d bytes", *v.AnswerStatus, derefInt(v.AnswerBytes))
		}
		if _, err := fmt.Fprintf(tw, "%s\t%s\n", fmt.Sprintf("verdict %d", i+1), safe(line)); err != nil {
			return err
		}
	}
	return nil
}

func kindNote(kind string) string {
	if kind == "" {
		return ""
	}
	return ", " + kind
}

func derefInt(p *int) int {
	if p == nil {
		return 0
	}
	return *p
}

// printVerdictsOfMissingKey prints the verdicts of a key that is gone.
func (e *env) printVerdictsOfMissingKey(verdicts []idemtype.Verdict) error {
	if len(verdicts) == 0 {
		return nil
	}
	if e.json {
		return e.printJSON(map[string]any{"key": nil, "verdicts": verdicts})
	}
	tw := e.table()
	fmt.Fprintf(tw, "%s\t%s\n", "key", "gone (expired and reaped, or abandoned); its verdicts are kept")
	if err := e.verdictLines(tw, verdicts); err != nil {
		return err
	}
	return tw.Flush()
}

// holderLine says which process took the key's current (or last) lease.
func holderLine(k *idemtype.KeyRecord) string {
	if k.HolderBoot == "" {
		if k.Status == idemtype.StoredFinished {
			return "-"
		}
		return "- (not recorded: a version before migration 0008 took the lease)"
	}
	who := fmt.Sprintf("host %s, pid %d, boot %s", k.HolderHost, k.HolderPID, k.HolderBoot)
	if k.HolderInstance == "" {
		return who + " (no instance name: a restart waits for its leases to run out)"
	}
	return fmt.Sprintf("instance %s, %s (a restart of %s takes its keys over at once)", k.HolderInstance, who, k.HolderInstance)
}

func (e *env) printUnlock(res *idemtype.UnlockResult) error {
	if e.json {
		// The statement's result has no clock; an unlocked key is stale and
		// a key left alone is finished or expired, which its expiry says.
		now := time.Now()
		return e.printJSON(map[string]any{"unlocked": res.Unlocked, "key": newKeyJSON(res.Record, now, false)})
	}
	k := res.Record
	if !res.Unlocked {
		_, err := fmt.Fprintf(e.out, "nothing to unlock: key %q (scope %q) is finished\n", k.Key, k.Scope)
		return err
	}
	next := "the next attempt resumes after " + safe(k.RecoveryPoint)
	if k.RecoveryPoint == idemtype.RecoveryPointStarted {
		next = "the next attempt starts it from its first phase"
	}
	if k.Status == idemtype.StoredNeedsReconcile {
		next = "it still needs reconciliation"
	} else if k.ForeignMark != "" {
		next = "its foreign call in " + safe(k.ForeignMark) + " is in doubt: the next attempt sends it to reconcile"
	}
	_, err := fmt.Fprintf(e.out, "unlocked key %q (scope %q): fence is now %d, so its previous holder cannot commit; %s\n",
		k.Key, k.Scope, k.Fence, next)
	return err
}

func (e *env) printResolve(res *idem.ResolveResult) error {
	if e.json {
		return e.printJSON(map[string]any{"verdict": res.Verdict, "dry_run": res.DryRun, "action": res.Action,
			"key": newKeyJSON(res.Record, time.Now(), false)})
	}
	k := res.Record
	done := "resolved"
	if res.DryRun {
		done = "dry run, nothing changed"
	}
	_, err := fmt.Fprintf(e.out, "key %q (scope %q), verdict %s (%s): %s\n", k.Key, k.Scope, res.Verdict, done, sanitize(res.Action))
	return err
}

func (e *env) printReap(res *idem.ReapResult) error {
	if e.json {
		return e.printJSON(res)
	}
	_, err := fmt.Fprintf(e.out, "reaped %d expired key(s) in %d batch(es), and %d unfinished key(s) past their retention\n", res.Deleted, res.Batches, res.Unfinished)
	if err == nil && res.NeedsReconcile > 0 {
		_, err = fmt.Fprintf(e.out, "moved %d unfinished key(s) with a not-idempotent call in doubt to needs_reconcile (not deleted); run `%s reconcile`\n",
			res.NeedsReconcile, e.cfg.Name)
	}
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
	if err == nil && res.NoHook > 0 {
		_, err = fmt.Fprintf(e.out, "%d key(s) left as they were: their call in doubt is at a phase with no reconcile hook in this binary\n", res.NoHook)
	}
	return err
}

func (e *env) printReconcileOne(out *idem.Outcome, summary string, err error) error {
	var perr error
	if e.json {
		v := map[string]any{"outcome": out.Kind, "summary": summary}
		if out.Record != nil {
			v["key"] = newKeyJSON(out.Record, time.Now(), false)
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

// sealedWith says which keys of the keyring seal the key's params and
// response body at rest.
func sealedWith(k *idemtype.KeyRecord) string {
	var parts []string
	if k.ParamsKeyID != "" {
		parts = append(parts, "params with key "+k.ParamsKeyID)
	}
	if k.ResponseKeyID != "" {
		parts = append(parts, "response body with key "+k.ResponseKeyID)
	}
	if len(parts) == 0 {
		return "no (stored in the clear)"
	}
	return strings.Join(parts, ", ")
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

// printable shows a body as text when it is printable UTF-8 (escaped, see
// safe, when it holds line breaks or other white space) and as base64
// otherwise, so no body can garble or drive the terminal.
func printable(b []byte) string {
	if len(b) == 0 {
		return "(empty)"
	}
	if utf8.Valid(b) && strings.IndexFunc(string(b), func(r rune) bool { return !unicode.IsPrint(r) && !unicode.IsSpace(r) }) < 0 {
		return safe(string(b))
	}
	return fmt.Sprintf("(%d bytes, base64) %s", len(b), base64.StdEncoding.EncodeToString(b))
}

// safe makes a string read from the database safe to print: as it is when
// every character is printable (letters, marks, numbers, punctuation,
// symbols and the ASCII space), and quoted with Go escapes otherwise, so
// that control characters (an ESC that starts a terminal sequence, a
// carriage return that overwrites the line, C1 controls), bidi overrides and
// other format characters, line separators and invalid UTF-8 are shown as
// \x1b, \r, \u202e and never reach the terminal raw.
func safe(s string) string {
	for _, r := range s {
		if r == utf8.RuneError || !unicode.IsPrint(r) {
			return strconv.Quote(s)
		}
	}
	return s
}

// sanitize escapes the characters safe refuses, but keeps newlines and adds
// no quotes: for messages (errors) that may quote text from the database.
func sanitize(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); {
		r, w := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && w == 1:
			fmt.Fprintf(&b, `\x%02x`, s[i])
		case r == '\n' || (r != utf8.RuneError && unicode.IsPrint(r)):
			b.WriteString(s[i : i+w])
		default:
			q := strconv.QuoteRune(r)
			b.WriteString(q[1 : len(q)-1])
		}
		i += w
	}
	return b.String()
}

// escapeJSONText escapes, as \uXXXX, the characters encoding/json writes
// raw although a terminal may act on them: DEL, the C1 controls, format
// characters such as bidi overrides, and the line and paragraph
// separators. They can only occur inside JSON strings, where the escape
// means the same character, so the document stays the same JSON.
func escapeJSONText(doc []byte) []byte {
	var out []byte
	for i := 0; i < len(doc); {
		r, w := utf8.DecodeRune(doc[i:])
		raw := r == utf8.RuneError && w == 1
		if !raw && r != 0x7f && (r < 0x80 || r >= 0xa0) && !unicode.Is(unicode.Cf, r) && r != '\u2028' && r != '\u2029' {
			if out != nil {
				out = append(out, doc[i:i+w]...)
			}
			i += w
			continue
		}
		if out == nil {
			out = append(make([]byte, 0, len(doc)+16), doc[:i]...)
		}
		// A byte that is not UTF-8 becomes the replacement character, as
		// encoding/json does.
		if r1, r2 := utf16.EncodeRune(r); r1 != utf8.RuneError {
			out = fmt.Appendf(out, `\u%04x\u%04x`, r1, r2)
		} else {
			out = fmt.Appendf(out, `\u%04x`, r)
		}
		i += w
	}
	if out == nil {
		return doc
	}
	return out
}
