package idemhttp

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Prefer: wait as RFC 7240 spells it: among other preferences, in any case,
// quoted or not, with parameters; capped by MaxWait; ignored when MaxWait
// is 0 or the value is not delta-seconds.
func TestPreferWait(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		headers []string
		max     time.Duration
		want    time.Duration
		asked   bool
	}{
		{[]string{"wait=5"}, 10 * time.Second, 5 * time.Second, true},
		{[]string{"respond-async, WAIT=3"}, 10 * time.Second, 3 * time.Second, true},
		{[]string{"handling=lenient", " wait = 4 ; foo=bar"}, 10 * time.Second, 4 * time.Second, true},
		{[]string{`wait="7"`}, 10 * time.Second, 7 * time.Second, true},
		{[]string{`foo="a,wait=9", wait=2`}, 10 * time.Second, 2 * time.Second, true},
		{[]string{"wait=60"}, 10 * time.Second, 10 * time.Second, true},
		{[]string{"wait=99999999999999999999999"}, 10 * time.Second, 10 * time.Second, true},
		{[]string{"wait=0"}, 10 * time.Second, 0, true},
		{[]string{"wait=5"}, 0, 0, false},
		{[]string{"wait=-1"}, 10 * time.Second, 0, false},
		{[]string{"wait=1.5"}, 10 * time.Second, 0, false},
		{[]string{"wait"}, 10 * time.Second, 0, false},
		{[]string{"waiting=5"}, 10 * time.Second, 0, false},
		{nil, 10 * time.Second, 0, false},
	} {
		h := http.Header{}
		for _, v := range tc.headers {
			h.Add("Prefer", v)
		}
		got, asked := preferWait(h, tc.max)
		require.Equal(t, tc.want, got, "%q", tc.headers)
		require.Equal(t, tc.asked, asked, "%q", tc.headers)
	}
	require.Equal(t, "wait=10", preferenceApplied(10*time.Second))
	require.Equal(t, "wait=1", preferenceApplied(1500*time.Millisecond), "never more than was applied")
}

// The wait a request gets, for every combination of Prefer, MaxWait and
// DefaultWait: the longest is MaxWait, or DefaultWait where MaxWait is 0;
// a request without Prefer waits DefaultWait within it; Prefer: wait=N
// asks for N within it, so wait=0 opts out.
func TestRequestWait(t *testing.T) {
	t.Parallel()
	const s = time.Second
	for _, tc := range []struct {
		name             string
		prefer           string
		maxWait, defWait time.Duration
		want             time.Duration
		asked            bool
	}{
		{"no Prefer, MaxWait 0", "", 0, 5 * s, 5 * s, false},
		{"no Prefer, MaxWait above DefaultWait", "", 60 * s, 5 * s, 5 * s, false},
		{"no Prefer, MaxWait below DefaultWait", "", 2 * s, 5 * s, 2 * s, false},
		{"no Prefer, DefaultWait off", "", 60 * s, 0, 0, false},
		{"wait=0, MaxWait 0", "wait=0", 0, 5 * s, 0, true},
		{"wait=0, MaxWait set", "wait=0", 60 * s, 5 * s, 0, true},
		{"wait=3, MaxWait 0", "wait=3", 0, 5 * s, 3 * s, true},
		{"wait=30, MaxWait 0: at most DefaultWait", "wait=30", 0, 5 * s, 5 * s, true},
		{"wait=30, MaxWait set", "wait=30", 60 * s, 5 * s, 30 * s, true},
		{"wait=90, MaxWait set: at most MaxWait", "wait=90", 60 * s, 5 * s, 60 * s, true},
		{"wait=3, both off: ignored", "wait=3", 0, 0, 0, false},
	} {
		h := http.Header{}
		if tc.prefer != "" {
			h.Set("Prefer", tc.prefer)
		}
		got, asked := requestWait(h, tc.maxWait, tc.defWait)
		require.Equal(t, tc.want, got, tc.name)
		require.Equal(t, tc.asked, asked, tc.name)
	}
}

// A Prefer header as large as the server accepts costs what a small one
// does: preferWait allocates nothing and stops at preferScanMax bytes and
// preferMax preferences, and a wait past them is ignored. Not parallel:
// testing.AllocsPerRun refuses to run in a parallel test.
func TestPreferWaitHugeHeader(t *testing.T) {
	commas := http.Header{"Prefer": {strings.Repeat(",", 1<<20)}}
	late := http.Header{"Prefer": {strings.Repeat("a=1,", 1<<18) + "wait=5"}}
	many := http.Header{"Prefer": {"respond-async", "handling=lenient"}}
	for range 100 {
		many["Prefer"] = append(many["Prefer"], "x")
	}
	many["Prefer"] = append(many["Prefer"], "wait=5")
	for name, h := range map[string]http.Header{"commas": commas, "late": late, "many headers": many} {
		asked := false
		allocs := testing.AllocsPerRun(10, func() { _, asked = preferWait(h, time.Minute) })
		require.False(t, asked, name)
		require.Zero(t, allocs, name)
	}
	got, asked := preferWait(http.Header{"Prefer": {strings.Repeat(" ", preferScanMax-10) + "wait=5"}}, time.Minute)
	require.True(t, asked, "a wait within the bytes examined counts")
	require.Equal(t, 5*time.Second, got)
}
