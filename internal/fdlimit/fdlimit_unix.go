//go:build unix

package fdlimit

import "syscall"

func current() (Limit, error) {
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
		return Limit{Unknown: true}, err
	}
	return Limit{Soft: uint64(rl.Cur), Hard: uint64(rl.Max)}, nil
}

func raise() (before, after Limit, err error) {
	var rl syscall.Rlimit
	if err = syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
		return Limit{Unknown: true}, Limit{Unknown: true}, err
	}
	before = Limit{Soft: uint64(rl.Cur), Hard: uint64(rl.Max)}
	if rl.Cur >= rl.Max {
		return before, before, nil
	}
	rl.Cur = rl.Max // the field types differ between platforms (uint64, int64): set, never built
	if err = syscall.Setrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
		return before, before, err
	}
	after, err = current()
	return before, after, err
}
