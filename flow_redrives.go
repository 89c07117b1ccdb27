package idem

// Redrives reports whether the completer finishes this flow's requests
// server-side when their clients give up: true unless FlowConfig.NoRedrive.
// An HTTP adapter says so in the 500 of a failed request, whose client must
// then not make the request anew under another key.
func (f *Flow[In]) Redrives() bool { return f.redrives() }
