package app

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/prefixlb/prefixlb/flowcontrol"
)

// maxKeyBytes bounds what hash-key reads: an API key is tens of bytes; more is a file given
// by mistake.
const maxKeyBytes = 64 << 10

// HashKeyCommand is `prefixlb hash-key`: the SHA-256 of an API key read from standard
// input, as a flow_control rule's api_key_sha256 holds it.
func HashKeyCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "hash-key",
		Short: "Print the SHA-256 of an API key read from stdin, for flow_control.rules[].api_key_sha256",
		Long: `Print the hex SHA-256 of an API key, as flow_control.rules[].api_key_sha256 holds it
(the config never holds the key itself).

The key is read from standard input, never from an argument: an argument would land in the
shell's history and in the process list. On a terminal it is read without echo; piped, the
input is one key, spaces and a final newline trimmed (as prefixlb trims the Authorization or
x-api-key header). The key's requests are charged to the flow "key:" followed by the first
16 digits printed, the ID the admin view and the metrics show.`,
		Example: `  prefixlb hash-key                      # paste the key; it is not echoed
  prefixlb hash-key < tenant-a.key
  kubectl get secret tenant-a -o jsonpath='{.data.api-key}' | base64 -d | prefixlb hash-key`,
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) > 0 {
				return errors.New("hash-key reads the key from stdin, never from an argument (it would land in the shell history); run: prefixlb hash-key < FILE, or type it at the prompt")
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, _ []string) error {
			key, err := readKey(cmd.InOrStdin(), cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			_, err = fmt.Fprintln(cmd.OutOrStdout(), flowcontrol.HashKey(key))
			return err
		},
	}
}

// readKey reads one key from in: without echo when in is a terminal, else the whole input
// up to maxKeyBytes. It never quotes the input in an error.
func readKey(in io.Reader, prompt io.Writer) (string, error) {
	var raw []byte
	if f, ok := in.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
		fmt.Fprint(prompt, "API key (not echoed): ")
		b, err := term.ReadPassword(int(f.Fd()))
		fmt.Fprintln(prompt)
		if err != nil {
			return "", fmt.Errorf("reading the key: %w", err)
		}
		raw = b
	} else {
		b, err := io.ReadAll(io.LimitReader(in, maxKeyBytes+1))
		if err != nil {
			return "", fmt.Errorf("reading the key from stdin: %w", err)
		}
		if len(b) > maxKeyBytes {
			return "", fmt.Errorf("stdin holds over %d bytes; give one API key", maxKeyBytes)
		}
		raw = b
	}
	key := strings.TrimSpace(string(raw))
	switch {
	case key == "":
		return "", errors.New("no key on stdin")
	case strings.ContainsAny(key, "\r\n"):
		return "", errors.New("stdin holds more than one line; give one API key")
	case len(key) > len("bearer ") && strings.EqualFold(key[:len("bearer ")], "bearer "):
		return "", errors.New(`the input starts with "Bearer ": give the key alone, as it follows "Bearer " in the Authorization header`)
	case strings.ContainsAny(key, " \t"):
		return "", errors.New("the key holds a space or tab; give the key alone")
	}
	return key, nil
}
