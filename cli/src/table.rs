//! Aligned columns as `ctr` prints them (Go's tabwriter with a padding of
//! four spaces): every column but the last is padded to its widest cell.

/// Spaces between two columns, as `ctr`.
const GAP: usize = 4;

/// Renders `rows` (the header first, if any), one line each, without
/// trailing spaces. Rows may have fewer cells than others.
pub fn table(rows: &[Vec<String>]) -> String {
    let rows: Vec<Vec<String>> = rows
        .iter()
        .map(|r| r.iter().map(|c| printable(c)).collect())
        .collect();
    let columns = rows.iter().map(Vec::len).max().unwrap_or(0);
    let mut widths = vec![0; columns];
    for row in &rows {
        for (i, cell) in row.iter().enumerate() {
            widths[i] = widths[i].max(cell.chars().count());
        }
    }
    let mut out = String::new();
    for row in &rows {
        let mut line = String::new();
        for (i, cell) in row.iter().enumerate() {
            line.push_str(cell);
            if i + 1 < row.len() {
                let pad = widths[i] - cell.chars().count() + GAP;
                line.extend(std::iter::repeat_n(' ', pad));
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// Control characters (escape sequences, newlines, tabs) as Rust escapes:
/// a manifest is shown before its MAC is trusted, and must not be able to
/// drive the terminal or break the columns.
pub fn printable(s: &str) -> String {
    if !s.chars().any(char::is_control) {
        return s.to_string();
    }
    s.chars()
        .map(|c| {
            if c.is_control() {
                c.escape_debug().to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
}

/// A row from string slices.
pub fn row<S: AsRef<str>>(cells: &[S]) -> Vec<String> {
    cells.iter().map(|c| c.as_ref().to_string()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_are_padded_to_the_widest_cell_plus_four() {
        let t = table(&[
            row(&["NAME", "SIZE", "STATUS"]),
            row(&["a", "1.0 MiB", "ok"]),
            row(&["longer-name", "12 B", "invalid: bad"]),
        ]);
        assert_eq!(
            t,
            "NAME           SIZE       STATUS\n\
             a              1.0 MiB    ok\n\
             longer-name    12 B       invalid: bad\n"
        );
    }

    #[test]
    fn the_last_column_is_not_padded_and_short_rows_are_fine() {
        let t = table(&[row(&["x", "y"]), row(&["xx"]), row(&["x", ""])]);
        assert_eq!(t, "x     y\nxx\nx\n");
        assert_eq!(table(&[]), "");
    }

    #[test]
    fn control_characters_are_escaped() {
        let t = table(&[row(&["a\u{1b}[31mred", "x\ny\tz"]), row(&["b", "ok"])]);
        assert_eq!(t, "a\\u{1b}[31mred    x\\ny\\tz\nb                 ok\n");
    }

    #[test]
    fn widths_count_characters_not_bytes() {
        let t = table(&[row(&["é", "1"]), row(&["ab", "2"])]);
        assert_eq!(t, "é     1\nab    2\n");
    }
}
