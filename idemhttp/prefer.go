package idemhttp

import (
	"net/http"
	"strconv"
	"strings"
	"time"
)

// preferWait returns the wait a request asks for with the RFC 7240
// preference wait=N (delta-seconds) in its Prefer headers, capped by max,
// and whether it asks for one. Preferences are separated by commas, within
// a header and across headers; names are case-insensitive, values tokens
// or quoted strings, and parameters after ";" are ignored. The first wait
// counts; one whose value is not delta-seconds is ignored, as RFC 7240
// asks of a preference a server does not understand.
func preferWait(header http.Header, max time.Duration) (time.Duration, bool) {
	if max <= 0 {
		return 0, false
	}
	for _, line := range header.Values("Prefer") {
		for _, pref := range splitOutsideQuotes(line, ',') {
			pref, _, _ = strings.Cut(pref, ";")
			name, value, ok := strings.Cut(pref, "=")
			if !ok || !strings.EqualFold(strings.TrimSpace(name), "wait") {
				continue
			}
			value = strings.TrimSpace(value)
			if len(value) >= 2 && value[0] == '"' && value[len(value)-1] == '"' {
				value = value[1 : len(value)-1]
			}
			secs, ok := deltaSeconds(value)
			if !ok {
				continue
			}
			if secs >= int64(max/time.Second)+1 {
				return max, true
			}
			return min(time.Duration(secs)*time.Second, max), true
		}
	}
	return 0, false
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

// splitOutsideQuotes splits s at sep outside quoted strings.
func splitOutsideQuotes(s string, sep byte) []string {
	var out []string
	start, quoted := 0, false
	for i := 0; i < len(s); i++ {
		switch {
		case quoted && s[i] == '\\':
			i++
		case s[i] == '"':
			quoted = !quoted
		case !quoted && s[i] == sep:
			out = append(out, s[start:i])
			start = i + 1
		}
	}
	return append(out, s[start:])
}

// preferenceApplied is the Preference-Applied value for a wait of w.
func preferenceApplied(w time.Duration) string {
	return "wait=" + strconv.FormatInt(int64((w+time.Second-1)/time.Second), 10)
}
