package pgstore

import (
	"encoding/json"
	"unicode/utf8"
)

// The guarded commit sends the checkpoint patch and the response header as
// JSON text. Their values are JSON already (the runner's SetCheckpoint
// encoded each once) or plain strings, so the objects are written here
// directly instead of through encoding/json, which would sort the keys,
// validate and compact every value again and allocate per key: the
// commit's largest client cost after its round trip.

// appendPatch appends the JSON object of patch: its names as JSON strings,
// its values as they are. A value that is not valid JSON makes the object
// invalid, which the server refuses (::jsonb), failing the commit as
// json.Marshal would have failed it before sending.
func appendPatch(dst []byte, patch map[string]json.RawMessage) []byte {
	dst = append(dst, '{')
	first := true
	for name, v := range patch {
		if !first {
			dst = append(dst, ',')
		}
		first = false
		dst = appendJSONString(dst, name)
		dst = append(dst, ':')
		if len(v) == 0 {
			v = json.RawMessage("null")
		}
		dst = append(dst, v...)
	}
	return append(dst, '}')
}

// appendHeader appends the JSON object of an HTTP header: each name with
// the array of its values.
func appendHeader(dst []byte, header map[string][]string) []byte {
	dst = append(dst, '{')
	first := true
	for name, values := range header {
		if !first {
			dst = append(dst, ',')
		}
		first = false
		dst = appendJSONString(dst, name)
		if values == nil {
			dst = append(dst, ":null"...)
			continue
		}
		dst = append(dst, ':', '[')
		for i, v := range values {
			if i > 0 {
				dst = append(dst, ',')
			}
			dst = appendJSONString(dst, v)
		}
		dst = append(dst, ']')
	}
	return append(dst, '}')
}

// appendJSONString appends s as a JSON string. Printable ASCII without a
// quote or a backslash, what names and header values almost always are,
// is copied as it is; anything else goes through encoding/json, which
// escapes control characters and replaces invalid UTF-8 as it always did.
func appendJSONString(dst []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c >= utf8.RuneSelf || c == '"' || c == '\\' {
			quoted, _ := json.Marshal(s) // a string always encodes
			return append(dst, quoted...)
		}
	}
	dst = append(dst, '"')
	dst = append(dst, s...)
	return append(dst, '"')
}
