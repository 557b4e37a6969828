use super::*;

#[test]
fn notes_wrap_at_words() {
    assert_eq!(
        wrap("grows in step with train.py:47: a view keeps its base", 20),
        [
            "grows in step with",
            "train.py:47: a view",
            "keeps its base"
        ]
    );
    assert_eq!(wrap("", 20), Vec::<String>::new());
    assert_eq!(
        wrap("averyveryverylongword x", 5),
        ["averyveryverylongword", "x"]
    );
}
