package pgproxy

// Waiting receives a value whenever a write starts waiting for Resume.
func Waiting(p *Proxy) <-chan struct{} { return p.waiting }
