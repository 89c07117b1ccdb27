package idemhttp

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/go-idem/idem"
)

// The tables of docs/http.md that state what the code does are checked
// against the code, so that neither drifts from the other.

// docSpecs is every problem type the adapter writes, in the order
// docs/http.md lists them.
var docSpecs = []problemSpec{
	specKeyMissing, specKeyMalformed, specKeyReused, specInProgress, specTooManyKeys, specNeedsReconcile,
	specRequestAbandoned, specRequestNotFound, specStoreUnavailable, specRequestFailed, specUnauthenticated, specMethodNotAllowed,
	specUnsupportedMediaType, specBodyTooLarge, specMalformedJSON, specMalformedForm, specInvalidInput, specInternal,
	specWebhookSignatureInvalid, specWebhookEventInvalid, specWebhookEventReused, specWebhookEventInProgress,
}

func specNamed(t *testing.T, name string) problemSpec {
	t.Helper()
	for _, s := range docSpecs {
		if s.name == name {
			return s
		}
	}
	t.Fatalf("docs/http.md names problem type %q, which the code does not have", name)
	return problemSpec{}
}

func readDocs(t *testing.T) string {
	t.Helper()
	doc, err := os.ReadFile("../docs/http.md")
	require.NoError(t, err)
	return string(doc)
}

// section returns the text under heading (a whole heading line, "## X"), up
// to the next heading of the same or a higher level.
func section(t *testing.T, doc, heading string) string {
	t.Helper()
	level := strings.Index(heading, " ")
	start := strings.Index(doc, "\n"+heading+"\n")
	require.GreaterOrEqual(t, start, 0, "docs/http.md has no heading %q", heading)
	rest := doc[start+len(heading)+2:]
	for i := 0; i < len(rest); {
		next := strings.Index(rest[i:], "\n#")
		if next < 0 {
			break
		}
		line := rest[i+next+1:]
		if hashes := len(line) - len(strings.TrimLeft(line, "#")); hashes <= level && strings.HasPrefix(line[hashes:], " ") {
			return rest[:i+next]
		}
		i += next + 1
	}
	return rest
}

// firstTable returns the rows of the first table in text, without its
// header and separator, each row's cells trimmed.
func firstTable(t *testing.T, text string) [][]string {
	t.Helper()
	var rows [][]string
	seen := 0
	for line := range strings.SplitSeq(text, "\n") {
		if !strings.HasPrefix(line, "|") {
			if len(rows) > 0 {
				break
			}
			continue
		}
		if seen++; seen <= 2 {
			continue
		}
		cells := strings.Split(strings.Trim(line, "|"), "|")
		for i := range cells {
			cells[i] = strings.TrimSpace(cells[i])
		}
		rows = append(rows, cells)
	}
	require.NotEmpty(t, rows, "no table in %q", text)
	return rows
}

var problemLink = regexp.MustCompile("\\[`([a-z-]+)`\\]\\(#([a-z-]+)\\)")

// Every problem type the code defines is in docsSpecs: a spec added to
// problemtypes.go must be documented.
func TestDocSpecsAreEverySpec(t *testing.T) {
	t.Parallel()
	src, err := os.ReadFile("problemtypes.go")
	require.NoError(t, err)
	defined := regexp.MustCompile(`(?m)^\s+spec\w+\s+= problemSpec\{`).FindAll(src, -1)
	require.Len(t, docSpecs, len(defined))
	names := map[string]bool{}
	for _, s := range docSpecs {
		require.False(t, names[s.name], "%s twice", s.name)
		names[s.name] = true
	}
}

// The problem types table, and each problem type's section: its status,
// title and example responses.
func TestDocsProblemTypes(t *testing.T) {
	t.Parallel()
	doc := readDocs(t)
	rows := firstTable(t, section(t, doc, "## Problem types"))
	require.Len(t, rows, len(docSpecs))
	for i, s := range docSpecs {
		code := ""
		if s.stripeCode != "" {
			code = "`" + s.stripeCode + "`"
		}
		require.Equal(t, []string{
			fmt.Sprintf("[`%s`](#%s)", s.name, s.name), s.title, strconv.Itoa(s.status), strconv.Itoa(s.stripeStatus),
			"`" + s.stripeType + "`", code,
		}, rows[i], "row %d", i+1)
	}

	intro := regexp.MustCompile(`^\*\*(\d{3})\*\*(?: \(Stripe: \*\*(\d{3})\*\*, ` + "`([a-z_]+)`" + `[^)]*\))?,\s+title\s+\*([^*]+)\*`)
	example := regexp.MustCompile("(?s)```http\nHTTP/1.1 (\\d{3}) [^\n]*\n.*?\n\n(\\{.*?\n\\})\n```")
	for _, s := range docSpecs {
		text := strings.TrimSpace(section(t, doc, "### "+s.name))
		m := intro.FindStringSubmatch(text)
		require.NotNil(t, m, "### %s does not start with its status and title", s.name)
		require.Equal(t, strconv.Itoa(s.status), m[1], s.name)
		if s.stripeStatus != s.status {
			require.Equal(t, strconv.Itoa(s.stripeStatus), m[2], "%s: the Stripe status", s.name)
			require.Equal(t, s.stripeType, m[3], s.name)
		} else {
			require.Empty(t, m[2], "%s: the Stripe status is the same", s.name)
		}
		require.Equal(t, s.title, strings.Join(strings.Fields(m[4]), " "), s.name) // a title may wrap

		examples := example.FindAllStringSubmatch(text, -1)
		require.NotEmpty(t, examples, "### %s has no example response", s.name)
		for _, ex := range examples {
			var body struct {
				Type   string       `json:"type"`
				Title  string       `json:"title"`
				Status int          `json:"status"`
				Detail string       `json:"detail"`
				Error  *StripeError `json:"error"`
			}
			require.NoError(t, json.Unmarshal([]byte(ex[2]), &body), "%s: %s", s.name, ex[2])
			require.Equal(t, ProblemTypeBaseDefault+s.name, body.Type, s.name)
			require.Equal(t, s.title, body.Title, s.name)
			require.Equal(t, ex[1], strconv.Itoa(body.Status), "%s: the status line and the body agree", s.name)
			require.NotEmpty(t, body.Detail, s.name)
			if body.Error == nil {
				require.Equal(t, s.status, body.Status, s.name)
				continue
			}
			require.Equal(t, s.stripeStatus, body.Status, "%s, Stripe profile", s.name)
			require.Equal(t, s.stripeType, body.Error.Type, s.name)
			require.Equal(t, s.stripeCode, body.Error.Code, s.name)
			require.Equal(t, body.Detail, body.Error.Message, s.name)
		}
	}
}

// "In one table": where a row names a problem type, its statuses are the
// type's.
func TestDocsSummaryTable(t *testing.T) {
	t.Parallel()
	rows := firstTable(t, section(t, readDocs(t), "## In one table"))
	named := 0
	for _, row := range rows {
		require.Len(t, row, 3, "%q", row)
		m := problemLink.FindStringSubmatch(row[1])
		if m == nil {
			continue
		}
		named++
		require.Equal(t, m[1], m[2], "the link leads to the type's section")
		s := specNamed(t, m[1])
		require.True(t, strings.HasPrefix(row[1], strconv.Itoa(s.status)+" "), "%q: IETF status %d", row[0], s.status)
		switch stripe := row[2]; {
		case stripe == "same":
			require.Equal(t, s.status, s.stripeStatus, "%q", row[0])
		default:
			require.True(t, strings.HasPrefix(stripe, strconv.Itoa(s.stripeStatus)), "%q: Stripe status %d", row[0], s.stripeStatus)
		}
	}
	require.GreaterOrEqual(t, named, len(docSpecs), "every problem type has a row")
}

// The Profiles table: the problem types whose Stripe answer differs.
func TestDocsProfilesTable(t *testing.T) {
	t.Parallel()
	rows := firstTable(t, section(t, readDocs(t), "## Profiles"))
	checked := 0
	for _, row := range rows {
		name, ok := strings.CutPrefix(row[0], "`")
		if !ok {
			continue
		}
		s := specNamed(t, strings.TrimSuffix(name, "`"))
		checked++
		require.Equal(t, strconv.Itoa(s.status), row[1], s.name)
		require.True(t, strings.HasPrefix(row[2], fmt.Sprintf("%d `%s`", s.stripeStatus, s.stripeType)), "%s: %q", s.name, row[2])
		if s.stripeCode != "" {
			require.Contains(t, row[2], "code `"+s.stripeCode+"`", s.name)
		}
	}
	require.Equal(t, 3, checked)
}

// The Configuration table lists every Config field in order, with the
// default New applies to it.
func TestDocsConfigurationTable(t *testing.T) {
	t.Parallel()
	seconds := func(d time.Duration) string { return strconv.Itoa(int(d/time.Second)) + " s" }
	wantDefault := map[string]string{
		"Scope":                 "required",
		"Prepare":               "none",
		"Validate":              "none",
		"Profile":               "`ProfileIETF`",
		"MaxBodyBytes":          fmt.Sprintf("`MaxBodyBytesDefault`, %d MiB", MaxBodyBytesDefault>>20),
		"MinKeyLength":          fmt.Sprintf("`MinKeyLengthDefault`, %d", MinKeyLengthDefault),
		"ReplayHeaders":         "none",
		"AllowUnknownFields":    "false",
		"SharedKeys":            "false",
		"ProblemTypeBase":       "`ProblemTypeBaseDefault`, `" + ProblemTypeBaseDefault + "`",
		"AuthChallenge":         "none",
		"UnavailableRetryAfter": "`UnavailableRetryAfterDefault`, " + seconds(UnavailableRetryAfterDefault),
		"ReconcileRetryAfter":   "`ReconcileRetryAfterDefault`, " + seconds(ReconcileRetryAfterDefault),
		"MaxWait":               "0: `DefaultWait`",
		"DefaultWait":           "`DefaultWaitTime`, " + seconds(DefaultWaitTime),
		"RespondAsync":          "false",
		"MonitorURL":            "none",
		"InProgress":            "`InProgressConflict`",
		"AsyncRetryAfter":       "`AsyncRetryAfterDefault`, " + seconds(AsyncRetryAfterDefault),
		"ShowRecoveryPoint":     "false",
		"Detached":              fmt.Sprintf("`DefaultDetachedRuns`, %d runs", DetachedLimitDefault),
		"Logger":                "the runner's",
	}
	rows := firstTable(t, section(t, readDocs(t), "## Configuration"))
	typ := reflect.TypeFor[Config[struct{}]]()
	require.Len(t, rows, typ.NumField())
	for i := range typ.NumField() {
		name := typ.Field(i).Name
		require.Equal(t, "`"+name+"`", rows[i][0], "row %d", i+1)
		want, ok := wantDefault[name]
		require.True(t, ok, "the test knows no default for %s", name)
		require.Equal(t, want, rows[i][1], name)
	}

	// And those are the defaults New applies.
	c := Config[struct{}]{Scope: func(*http.Request) (string, error) { return "s", nil }}
	_, err := c.apply()
	require.NoError(t, err)
	require.Equal(t, ProfileIETF, c.Profile)
	require.EqualValues(t, MaxBodyBytesDefault, c.MaxBodyBytes)
	require.Equal(t, MinKeyLengthDefault, c.MinKeyLength)
	require.Equal(t, ProblemTypeBaseDefault, c.ProblemTypeBase)
	require.Equal(t, UnavailableRetryAfterDefault, c.UnavailableRetryAfter)
	require.Equal(t, ReconcileRetryAfterDefault, c.ReconcileRetryAfter)
	require.Empty(t, c.ReplayHeaders)
	require.False(t, c.AllowUnknownFields)
	require.Zero(t, c.MaxWait)
	require.Equal(t, DefaultWaitTime, c.DefaultWait)
	require.Equal(t, InProgressConflict, c.InProgress)
	require.Equal(t, AsyncRetryAfterDefault, c.AsyncRetryAfter)
	require.Same(t, DefaultDetachedRuns, c.Detached)
	require.Equal(t, DetachedLimitDefault, c.Detached.Limit())
}

// The Retry-After table's defaults.
func TestDocsRetryAfterTable(t *testing.T) {
	t.Parallel()
	rows := firstTable(t, section(t, readDocs(t), "### Retry-After"))
	want := map[string]string{
		"409 in progress":       fmt.Sprintf("`Config.MaxRetryAfter` (default %d)", (&idem.Config{}).WithDefaults().MaxRetryAfter/time.Second),
		"503 needs reconcile":   fmt.Sprintf("`Config.ReconcileRetryAfter`, default %d", ReconcileRetryAfterDefault/time.Second),
		"503 store unavailable": fmt.Sprintf("`Config.UnavailableRetryAfter`, default %d", UnavailableRetryAfterDefault/time.Second),
		"409 after a takeover":  "1:",
	}
	for _, row := range rows {
		if w, ok := want[row[0]]; ok {
			require.Contains(t, row[1], w, row[0])
			delete(want, row[0])
		}
	}
	require.Empty(t, want, "rows missing from the table")
}

// The Configuration table of docs/webhooks.md lists every WebhookConfig
// field in order, with the default NewWebhook applies to it; its contract
// table names the webhook problem types with their statuses.
func TestDocsWebhooks(t *testing.T) {
	t.Parallel()
	raw, err := os.ReadFile("../docs/webhooks.md")
	require.NoError(t, err)
	doc := string(raw)
	seconds := func(d time.Duration) string { return strconv.Itoa(int(d/time.Second)) + " s" }
	wantDefault := map[string]string{
		"Provider":              "required",
		"Account":               "none: one account",
		"EventID":               "required",
		"Verify":                "required",
		"Content":               "the whole body",
		"MaxBodyBytes":          fmt.Sprintf("`MaxBodyBytesDefault`, %d MiB", MaxBodyBytesDefault>>20),
		"RedeliveryWindow":      fmt.Sprintf("`RedeliveryWindowDefault`, %d h", RedeliveryWindowDefault/time.Hour),
		"ReplayHeaders":         "none",
		"ProblemTypeBase":       "`ProblemTypeBaseDefault`",
		"UnavailableRetryAfter": "`UnavailableRetryAfterDefault`, " + seconds(UnavailableRetryAfterDefault),
		"ReconcileRetryAfter":   "`ReconcileRetryAfterDefault`, " + seconds(ReconcileRetryAfterDefault),
		"Logger":                "the runner's",
	}
	rows := firstTable(t, section(t, doc, "## Configuration"))
	typ := reflect.TypeFor[WebhookConfig]()
	require.Len(t, rows, typ.NumField())
	for i := range typ.NumField() {
		name := typ.Field(i).Name
		require.Equal(t, "`"+name+"`", rows[i][0], "row %d", i+1)
		want, ok := wantDefault[name]
		require.True(t, ok, "the test knows no default for %s", name)
		require.Equal(t, want, rows[i][1], name)
	}
	c := WebhookConfig{Provider: "p", EventID: JSONValue("id"), Verify: func(*http.Request, []byte) error { return nil }}
	require.NoError(t, c.validate())
	require.Equal(t, RedeliveryWindowDefault, c.RedeliveryWindow)

	named := 0
	for _, row := range firstTable(t, section(t, doc, "## The contract")) {
		m := regexp.MustCompile("\\[`([a-z-]+)`\\]\\(http\\.md#([a-z-]+)\\)").FindStringSubmatch(row[1])
		if m == nil {
			continue
		}
		named++
		require.Equal(t, m[1], m[2])
		s := specNamed(t, m[1])
		require.True(t, strings.HasPrefix(row[1], strconv.Itoa(s.status)+" "), "%q: status %d", row[0], s.status)
	}
	require.GreaterOrEqual(t, named, 4)
}
