package idemhttp

import (
	"net/http"
	"strconv"
	"strings"
	"time"
)

// preferScanMax bounds the bytes of Prefer headers preferWait examines, and
// preferMax the preferences: a request cannot make the handler work in
// proportion to a header as large as the server accepts. A wait beyond them
// is ignored, as a preference the server does not understand is.
const (
	preferScanMax = 4096
	preferMax     = 32
)

// preferWait returns the wait a request asks for with the RFC 7240
// preference wait=N (delta-seconds) in its Prefer headers, capped by max,
// and whether it asks for one. The first wait counts; one whose value is
// not delta-seconds is ignored, as RFC 7240 asks of a preference a server
// does not understand.
func preferWait(header http.Header, max time.Duration) (time.Duration, bool) {
	if max <= 0 {
		return 0, false
	}
	var wait time.Duration
	found := eachPreference(header, func(pref string) bool {
		secs, ok := waitPreference(pref)
		if !ok {
			return false
		}
		wait = time.Duration(secs) * time.Second
		if secs >= int64(max/time.Second)+1 {
			wait = max
		}
		return true
	})
	return wait, found
}

// preferRespondAsync reports whether a request asks, with the RFC 7240
// preference respond-async in its Prefer headers, to be answered 202
// Accepted rather than held until its flow ends.
func preferRespondAsync(header http.Header) bool {
	return eachPreference(header, func(pref string) bool {
		pref, _ = nextOutsideQuotes(pref, ';')
		name, _, _ := strings.Cut(pref, "=")
		return strings.EqualFold(strings.TrimSpace(name), "respond-async")
	})
}

// eachPreference calls found with each preference of the Prefer headers
// until it returns true, and reports whether it did. Preferences are
// separated by commas, within a header and across headers; names are
// case-insensitive, values tokens or quoted strings, and parameters follow
// ";". It allocates nothing and examines at most preferScanMax bytes and
// preferMax preferences: a preference beyond them is ignored, as one the
// server does not understand is.
func eachPreference(header http.Header, found func(pref string) bool) bool {
	budget, prefs := preferScanMax, 0
	for _, line := range header["Prefer"] {
		if len(line) > budget {
			line = line[:budget]
		}
		budget -= len(line)
		for line != "" {
			if prefs++; prefs > preferMax {
				return false
			}
			var pref string
			pref, line = nextOutsideQuotes(line, ',')
			if found(pref) {
				return true
			}
		}
		if budget <= 0 {
			break
		}
	}
	return false
}

// waitPreference returns N when pref is wait=N with N delta-seconds.
func waitPreference(pref string) (int64, bool) {
	pref, _ = nextOutsideQuotes(pref, ';')
	name, value, ok := strings.Cut(pref, "=")
	if !ok || !strings.EqualFold(strings.TrimSpace(name), "wait") {
		return 0, false
	}
	value = strings.TrimSpace(value)
	if len(value) >= 2 && value[0] == '"' && value[len(value)-1] == '"' {
		value = value[1 : len(value)-1]
	}
	return deltaSeconds(value)
}

// deltaSeconds parses RFC 9111 delta-seconds: one or more digits, a value
// too large to hold read as a very long time.
func deltaSeconds(s string) (int64, bool) {
	if s == "" {
		return 0, false
	}
	for i := range len(s) {
		if s[i] < '0' || s[i] > '9' {
			return 0, false
		}
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return 1 << 62, true
	}
	return n, true
}

// nextOutsideQuotes returns s up to the first sep outside a quoted string,
// and what follows that sep ("" when there is none).
func nextOutsideQuotes(s string, sep byte) (string, string) {
	quoted := false
	for i := 0; i < len(s); i++ {
		switch {
		case quoted && s[i] == '\\':
			i++
		case s[i] == '"':
			quoted = !quoted
		case !quoted && s[i] == sep:
			return s[:i], s[i+1:]
		}
	}
	return s, ""
}

// preferenceApplied is the Preference-Applied value for a wait of w: the
// whole seconds the handler granted, rounded down, so that it never claims
// more than it applied.
func preferenceApplied(w time.Duration) string {
	return "wait=" + strconv.FormatInt(int64(w/time.Second), 10)
}

// requestWait is the wait a request gets for another attempt of its key in
// flight, and whether it asked for it with Prefer: wait. The longest is
// maxWait, or defaultWait where maxWait is 0; within it, a request that
// asks nothing waits defaultWait, and one that sends Prefer: wait=N waits
// N seconds, so wait=0 opts out. idemgrpc caps its default wait the same
// way.
func requestWait(header http.Header, maxWait, defaultWait time.Duration) (time.Duration, bool) {
	limit := maxWait
	if limit == 0 {
		limit = defaultWait
	}
	if wait, asked := preferWait(header, limit); asked {
		return wait, true
	}
	return min(defaultWait, limit), false
}
